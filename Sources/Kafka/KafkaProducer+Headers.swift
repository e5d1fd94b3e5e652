import CRdKafka

extension KafkaProducer {
    /// Hands one record with headers to librdkafka (`rd_kafka_produceva`: `rd_kafka_produce`
    /// takes none). Value, key and headers are copied by librdkafka before this returns. Nil
    /// when it took the record; the error otherwise (the caller releases `opaque`).
    static func produceWithHeaders(_ topicHandle: TopicHandle, partition: Int32 = RD_KAFKA_PARTITION_UA, key: [UInt8]?, value: [UInt8]?,
                                   headers: [KafkaHeader], opaque: UnsafeMutableRawPointer, topic: String) -> KafkaError? {
        // Every header's name (NUL-terminated) and value in one buffer, so that one pointer
        // stays valid for the whole call.
        var storage: [UInt8] = []
        var layout: [(name: Int, value: Int, size: Int)] = []
        for header in headers {
            let name = storage.count
            storage += Array(header.name.utf8) + [0]
            let value = storage.count
            if let bytes = header.value { storage += bytes }
            // A negative size is a null value.
            layout.append((name, value, header.value?.count ?? -1))
        }
        return storage.withUnsafeBytes { store in
            withOptionalBytes(value) { valueBytes in
                withOptionalBytes(key) { keyBytes in
                    var fields = [rd_kafka_vu_t](repeating: rd_kafka_vu_t(), count: 6 + headers.count)
                    fields[0].vtype = RD_KAFKA_VTYPE_RKT
                    fields[0].u.rkt = topicHandle.pointer
                    fields[1].vtype = RD_KAFKA_VTYPE_PARTITION
                    fields[1].u.i32 = partition
                    fields[2].vtype = RD_KAFKA_VTYPE_VALUE
                    fields[2].u.mem.ptr = valueBytes.flatMap { UnsafeMutableRawPointer(mutating: $0.baseAddress) }
                    fields[2].u.mem.size = valueBytes?.count ?? 0
                    fields[3].vtype = RD_KAFKA_VTYPE_KEY
                    fields[3].u.mem.ptr = keyBytes.flatMap { UnsafeMutableRawPointer(mutating: $0.baseAddress) }
                    fields[3].u.mem.size = keyBytes?.count ?? 0
                    fields[4].vtype = RD_KAFKA_VTYPE_MSGFLAGS
                    fields[4].u.i = RD_KAFKA_MSG_F_COPY
                    fields[5].vtype = RD_KAFKA_VTYPE_OPAQUE
                    fields[5].u.ptr = opaque
                    let base = store.baseAddress!
                    for (index, entry) in layout.enumerated() {
                        fields[6 + index].vtype = RD_KAFKA_VTYPE_HEADER
                        fields[6 + index].u.header.name = base.advanced(by: entry.name).assumingMemoryBound(to: CChar.self)
                        fields[6 + index].u.header.val = entry.size < 0 ? nil : base.advanced(by: entry.value)
                        fields[6 + index].u.header.size = entry.size
                    }
                    guard let error = topicHandle.client.withHandle({ rd_kafka_produceva($0, &fields, fields.count) }) else {
                        return nil
                    }
                    defer { rd_kafka_error_destroy(error) }
                    return KafkaError(rd_kafka_error_code(error), context: "produce to \(topic)")
                }
            }
        }
    }
}
