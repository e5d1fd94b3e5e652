import Foundation
import Testing

@Suite("The Grafana dashboard", .timeLimit(.minutes(1)))
struct DashboardTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    static func dashboard() throws -> [String: Any] {
        let data = try Data(contentsOf: root.appendingPathComponent("deploy/grafana/apns-relay.json"))
        return try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
    }

    /// Every query of every panel, with its panel's title.
    static func queries(_ dashboard: [String: Any]) throws -> [(panel: String, expr: String)] {
        let panels = try #require(dashboard["panels"] as? [[String: Any]])
        return panels.flatMap { panel in
            ((panel["targets"] as? [[String: Any]]) ?? []).compactMap { target in
                (target["expr"] as? String).map { (panel["title"] as? String ?? "?", $0) }
            }
        }
    }

    /// `namespace`, `job`, `pod`, `topic` and `lane` narrow every panel: each metric a query reads
    /// is selected by the three scope variables, the outcome counter by the app too, and the
    /// metrics with a lane label by the lane.
    @Test func everyQueryFollowsTheScopeAndAppVariables() throws {
        let dashboard = try Self.dashboard()
        let variables = try #require((dashboard["templating"] as? [String: Any])?["list"] as? [[String: Any]])
        let names = variables.compactMap { $0["name"] as? String }
        #expect(names == ["datasource", "namespace", "job", "pod", "apns_topic", "lane"])
        for variable in variables where variable["type"] as? String == "query" {
            // "All" must also match series a scrape labelled without them.
            #expect(variable["includeAll"] as? Bool == true && variable["allValue"] as? String == ".*", "\(variable)")
        }
        let queries = try Self.queries(dashboard)
        #expect(queries.count >= 20)
        for (panel, expr) in queries {
            let references = expr.matches(of: /\b(apns_relay_[a-z0-9_]+)(\{[^}]*\})?/)
            #expect(!references.isEmpty, "\(panel): \(expr)")
            for reference in references {
                let selector = String(reference.output.2 ?? "")
                for scope in [#"namespace=~"$namespace""#, #"job=~"$job""#, #"pod=~"$pod""#] {
                    #expect(selector.contains(scope), "\(panel): \(reference.output.1) lacks \(scope) in \(expr)")
                }
                if reference.output.1 == "apns_relay_outcomes_total" {
                    #expect(selector.contains(#"apns_topic=~"$apns_topic""#), "\(panel): \(expr)")
                }
                if ["apns_relay_intents_consumed_total", "apns_relay_in_flight", "apns_relay_consumer_lag", "apns_relay_intent_duration_seconds_bucket"]
                    .contains(String(reference.output.1)) {
                    #expect(selector.contains(#"lane=~"$lane""#), "\(panel): \(expr)")
                }
            }
        }
        // Per-app panels: grouped by the APNs topic.
        #expect(queries.filter { $0.expr.contains("by (apns_topic") }.count >= 3)
    }
}
