local now, due = tonumber(ARGV[5]), tonumber(ARGV[4])
if ARGV[6] == '1' then
    due = math.max(due, backOff(KEYS[2], now, tonumber(ARGV[7]), tonumber(ARGV[8])))
end
local m = redis.call('HMGET', KEYS[1], 'pid', 'p', 'cid', 'c', 'pd')
-- Whether the entry of `id` (parked or being sent) came later in the same partition of the
-- same lane than this one: an older intent (a redelivery after a crash) never displaces a newer
-- one, it is displaced. The header: partition, offset, consumed at, expiration[, lane topic].
local function position(entry)
    local partition, offset, rest = string.match(entry or '', '^(%d+) (%d+) %d+ %d+([^\n]*)\n')
    return partition, tonumber(offset), rest
end
local partition, offset, lane = position(ARGV[2])
local function newer(id, entry)
    if not id or id == ARGV[1] then return false end
    local p, o, l = position(entry)
    return p ~= nil and p == partition and l == lane and offset ~= nil and o > offset
end
local keeper = ARGV[1]
if redis.call('HEXISTS', KEYS[1], 'd:' .. ARGV[1]) == 1 then
    -- Displaced before (a redelivery, its `coalesced` outcome not out yet): it stays displaced,
    -- under whatever lease its hand-over has, and is not parked again, which would send it
    -- after the intent that displaced it.
    keeper = redis.call('HGET', KEYS[1], 'db:' .. ARGV[1]) or m[1] or m[3] or ''
    return {tonumber(m[5]) or due, leaseDisplaced(now, tonumber(ARGV[10]), ARGV[11]), keeper}
end
-- A displaced entry is kept (field `d:<id>`, what displaced it `db:<id>`) until the relay
-- acknowledged its `coalesced` outcome: a lost reply to this park, or a relay dying before
-- publishing, does not lose it (displaced.lua hands it over).
if newer(m[1], m[2]) or newer(m[3], m[4]) then
    keeper = newer(m[1], m[2]) and m[1] or m[3]
    due = tonumber(m[5]) or due
    redis.call('HSET', KEYS[1], 'd:' .. ARGV[1], ARGV[2], 'db:' .. ARGV[1], keeper)
    redis.call('HDEL', KEYS[1], 't:' .. ARGV[1])
    -- The one parking was being sent (a 429, or the retry budget ran out): its claim ends.
    if m[3] == ARGV[1] then
        redis.call('HDEL', KEYS[1], 'cid', 'c', 'ce', 'cu')
        markWaiting(3)
    end
else
    if m[1] and m[1] ~= ARGV[1] then
        redis.call('HSET', KEYS[1], 'd:' .. m[1], m[2], 'db:' .. m[1], ARGV[1])
        redis.call('HDEL', KEYS[1], 't:' .. m[1])
    end
    -- Its trace context (`t:<id>`: traceparent, a newline, tracestate), for its outcome.
    if ARGV[9] ~= '' then redis.call('HSET', KEYS[1], 't:' .. ARGV[1], ARGV[9])
    else redis.call('HDEL', KEYS[1], 't:' .. ARGV[1]) end
    local expiration = tonumber(ARGV[3])
    due = math.min(due, expiration * 1000 + 1000)
    redis.call('HSET', KEYS[1], 'pid', ARGV[1], 'p', ARGV[2], 'pe', ARGV[3], 'pd', due)
    if m[3] == ARGV[1] then redis.call('HDEL', KEYS[1], 'cid', 'c', 'ce', 'cu') end
    local keep = math.max(0, expiration * 1000 - now) + 86400000
    if redis.call('PTTL', KEYS[1]) < keep then redis.call('PEXPIRE', KEYS[1], keep) end
    markWaiting(3)
end
-- Every displaced entry not yet acknowledged, leased to this park where no other hand-over's
-- lease runs (ARGV 10 and 11: lease ms, owner).
return {due, leaseDisplaced(now, tonumber(ARGV[10]), ARGV[11]), keeper}
