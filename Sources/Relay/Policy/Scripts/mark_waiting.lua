-- Rewrites the `waiting` string (KEYS[w]) from the mailbox hash (KEYS[1]), in every script
-- that changes the mailbox's ids. The park, take and release scripts start with this function.
local function markWaiting(w)
    local m = redis.call('HMGET', KEYS[1], 'pid', 'cid')
    if m[1] or m[2] then
        local p, c = m[1] or '', m[2] or ''
        local ttl = redis.call('PTTL', KEYS[1])
        if ttl < 1 then ttl = 86400000 end
        redis.call('SET', KEYS[w], #p .. ':' .. p .. c, 'PX', ttl)
    else
        redis.call('DEL', KEYS[w])
    end
end
