-- A sliding-window budget (LiveActivityBudgets): KEYS[1] a sorted set of the intents that spent
-- it, scored by when (ms). ARGV: now ms, limit, window ms, the intent id. An intent that spent
-- it already (retried, redelivered) passes without spending again. Answers {1, 0} when the
-- intent may go now, else {0, ms until the oldest spend leaves the window}.
local now, limit, window = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if redis.call('TYPE', KEYS[1]).ok ~= 'zset' then redis.call('DEL', KEYS[1]) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZSCORE', KEYS[1], ARGV[4]) then return {1, 0} end
if redis.call('ZCARD', KEYS[1]) < limit then
    redis.call('ZADD', KEYS[1], now, ARGV[4])
    redis.call('PEXPIRE', KEYS[1], window)
    return {1, 0}
end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {0, math.max(tonumber(oldest[2]) + window - now, 1)}
