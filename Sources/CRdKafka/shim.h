#pragma once
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

/// One (error, response delay) on a mock broker's stack for `api_key`: the variadic
/// rd_kafka_mock_broker_push_request_error_rtts, which Swift cannot call, with one tuple.
static inline rd_kafka_resp_err_t apns_relay_mock_broker_push_error_rtt(rd_kafka_mock_cluster_t *cluster, int32_t broker_id,
                                                                         int16_t api_key, rd_kafka_resp_err_t error, int rtt_ms) {
    return rd_kafka_mock_broker_push_request_error_rtts(cluster, broker_id, api_key, 1, error, rtt_ms);
}
