-- The entries displaced from the mailbox (KEYS[1]) whose `coalesced` outcome is not out yet
-- (`d:<id>`, the intent that displaced it in `db:<id>`), handed over under a lease (`dl:<id>`:
-- "<until ms> <owner>") so that two relays never publish one's outcome both: an entry under no
-- lease, an ended one or `owner`'s own (its hand-over asked again) is leased to `owner` until
-- now + lease; one under another's running lease is answered too, as not `owner`'s, with its
-- lease's end (where its due-index member must stand: a relay that dies holding the lease
-- leaves it to the partition's poll). Answers {id, entry, displaced by or '', 1 if `owner`'s
-- else 0, lease end, ...}.
local function leaseDisplaced(now, lease, owner)
    local found = {}
    for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
        if string.sub(field, 1, 2) == 'd:' then
            local id = string.sub(field, 3)
            local ends, holder = string.match(redis.call('HGET', KEYS[1], 'dl:' .. id) or '', '^(%d+) (.*)$')
            ends = tonumber(ends) or 0
            local mine = 0
            if ends <= now or holder == owner then
                ends = now + lease
                redis.call('HSET', KEYS[1], 'dl:' .. id, ends .. ' ' .. owner)
                mine = 1
            end
            for _, value in ipairs({id, redis.call('HGET', KEYS[1], field), redis.call('HGET', KEYS[1], 'db:' .. id) or '', mine, ends}) do
                table.insert(found, value)
            end
        end
    end
    return found
end
