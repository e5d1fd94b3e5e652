import Redis
import Testing

/// ``RedisInfo``: the fields of an `INFO` reply, as Redis 7 writes it.
@Suite("Redis INFO text")
struct RedisInfoTests {
    @Test func fieldsAreReadAcrossSectionsAndLineEnds() {
        let text = "# CPU\r\nused_cpu_sys:0.277270\r\nused_cpu_user:1.551840\r\n\r\n# Commandstats\r\n"
            + "cmdstat_set:calls=300000,usec=1032871,usec_per_call=3.44,rejected_calls=0,failed_calls=0\r\n"
            + "cmdstat_script|load:calls=1,usec=93,usec_per_call=93.00\r\nno colon here\r\nempty:\r\n"
        let fields = RedisInfo.fields(text)
        #expect(fields["used_cpu_sys"] == "0.277270")
        #expect(fields["used_cpu_user"] == "1.551840")
        #expect(fields["cmdstat_set"] == "calls=300000,usec=1032871,usec_per_call=3.44,rejected_calls=0,failed_calls=0")
        #expect(fields["cmdstat_script|load"] == "calls=1,usec=93,usec_per_call=93.00")
        #expect(fields["empty"] == "")
        #expect(fields.count == 5, "headers and the line without a colon are left out: \(fields.keys)")
    }
}
