local id, now, burst, interval = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local m = redis.call('HMGET', KEYS[1], 'pid', 'p', 'pe', 'cid', 'c', 'ce', 'cu')
local entry, expiration, parked
if m[1] == id then
    if m[4] and m[4] ~= id then
        -- Another intent's claim still runs: one notification at a time per device and app.
        -- This entry waits for its release (which moves the entry's index member up), at the
        -- latest for its lease's end.
        local cu = tonumber(m[7]) or 0
        if cu > now then return {6, cu} end
        -- Its lease ran out (its relay died, or the answer to its take was lost): that intent
        -- is older and unanswered. It goes first: the relay takes it, then this one.
        return {5, m[4]}
    end
    entry, expiration, parked = m[2], tonumber(m[3]) or 0, true
elseif m[4] == id then
    -- A claim whose lease runs is another relay's (or an earlier take's): ask again at its end.
    local cu = tonumber(m[7]) or 0
    if cu > now then return {2, cu} end
    entry, expiration, parked = m[5], tonumber(m[6]) or 0, false
elseif redis.call('HEXISTS', KEYS[1], 'd:' .. id) == 1 then
    -- Displaced, its `coalesced` outcome not out (the relay handing it over died, or its
    -- publish failed): this take hands it over, unless another hand-over's lease runs (then it
    -- is asked again at the lease's end). {7, entry, the intent that displaced it}.
    local ends, holder = string.match(redis.call('HGET', KEYS[1], 'dl:' .. id) or '', '^(%d+) (.*)$')
    ends = tonumber(ends) or 0
    if ends > now and holder ~= ARGV[6] then return {2, ends} end
    redis.call('HSET', KEYS[1], 'dl:' .. id, (now + tonumber(ARGV[5])) .. ' ' .. ARGV[6])
    return {7, redis.call('HGET', KEYS[1], 'd:' .. id), redis.call('HGET', KEYS[1], 'db:' .. id) or m[1] or m[4] or ''}
else return {0} end
local function clear()
    if parked then redis.call('HDEL', KEYS[1], 'pid', 'p', 'pe', 'pd')
    else redis.call('HDEL', KEYS[1], 'cid', 'c', 'ce', 'cu') end
    markWaiting(5)
end
-- The entry becomes this take's claim: it stays in the mailbox, under a lease, until its
-- outcome is out (release); a relay that dies first leaves it to be taken again.
local function claim()
    clear()
    redis.call('HSET', KEYS[1], 'cid', id, 'c', entry, 'ce', expiration, 'cu', now + tonumber(ARGV[5]))
    markWaiting(5)
end
-- The entry's trace context, if it had one (false: none).
local trace = redis.call('HGET', KEYS[1], 't:' .. id)
local seen = redis.call('GET', KEYS[3])
if seen then claim(); return {1, entry, trace, seen} end
if expiration * 1000 < now then claim(); return {4, entry, trace} end
local tat = tonumber(redis.call('GET', KEYS[2]) or '') or now
if tat < now then tat = now end
local bu = tonumber(string.match(redis.call('GET', KEYS[4]) or '', '^(%d+)') or '') or 0
local ahead = (burst - 1) * interval
if now < bu or (burst > 0 and tat - now > ahead) then
    local at = now
    if bu > at then at = bu end
    if burst > 0 and tat - ahead > at then at = tat - ahead end
    at = math.min(at, expiration * 1000 + 1000)
    if parked then redis.call('HSET', KEYS[1], 'pd', at) end
    return {2, at}
end
if burst > 0 then redis.call('SET', KEYS[2], tat + interval, 'PX', tat + interval - now + 60000) end
claim()
return {3, entry, trace}
