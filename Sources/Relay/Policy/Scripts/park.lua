local now, due = tonumber(ARGV[5]), tonumber(ARGV[4])
if ARGV[6] == '1' then
    local bu, bl = 0, 0
    local b = redis.call('GET', KEYS[2])
    if b then
        local u, l = string.match(b, '^(%d+) (%d+)$')
        bu, bl = tonumber(u) or 0, tonumber(l) or 0
    end
    local base, top = tonumber(ARGV[7]), tonumber(ARGV[8])
    if bu == 0 or now > bu + top then bl = 0 else bl = bl + 1 end
    local length = math.min(top, base * (2 ^ math.min(bl, 30)))
    bu = now + length
    redis.call('SET', KEYS[2], bu .. ' ' .. bl, 'PX', length + top)
    due = math.max(due, bu)
end
local m = redis.call('HMGET', KEYS[1], 'pid', 'p', 'cid')
-- A displaced entry is kept (field `d:<id>`) until the relay acknowledged its `coalesced`
-- outcome: a lost reply to this park, or a relay dying before publishing, does not lose it.
if m[1] and m[1] ~= ARGV[1] then redis.call('HSET', KEYS[1], 'd:' .. m[1], m[2]) end
local expiration = tonumber(ARGV[3])
due = math.min(due, expiration * 1000 + 1000)
redis.call('HSET', KEYS[1], 'pid', ARGV[1], 'p', ARGV[2], 'pe', ARGV[3], 'pd', due)
if m[3] == ARGV[1] then redis.call('HDEL', KEYS[1], 'cid', 'c', 'ce', 'cu') end
local keep = math.max(0, expiration * 1000 - now) + 86400000
if redis.call('PTTL', KEYS[1]) < keep then redis.call('PEXPIRE', KEYS[1], keep) end
markWaiting(3)
-- Every displaced entry not yet acknowledged: {id, entry, id, entry, ...}.
local displaced = {}
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
    if string.sub(field, 1, 2) == 'd:' then
        table.insert(displaced, string.sub(field, 3))
        table.insert(displaced, redis.call('HGET', KEYS[1], field))
    end
end
return {due, displaced}
