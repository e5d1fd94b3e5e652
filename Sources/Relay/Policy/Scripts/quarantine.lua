-- Moves a claimed entry no relay can read out of its mailbox: KEYS mailbox, waiting, quarantine;
-- ARGV id, how long the quarantine keeps it (ms). Only while `id` holds the claim, or is a
-- displaced entry taken for its hand-over (answers 1).
local id = ARGV[1]
if redis.call('HGET', KEYS[1], 'cid') == id then
    redis.call('SET', KEYS[3], redis.call('HGET', KEYS[1], 'c') or '', 'PX', ARGV[2])
    redis.call('HDEL', KEYS[1], 'cid', 'c', 'ce', 'cu', 't:' .. id)
    markWaiting(2)
    return 1
end
local displaced = redis.call('HGET', KEYS[1], 'd:' .. id)
if not displaced then return 0 end
redis.call('SET', KEYS[3], displaced, 'PX', ARGV[2])
redis.call('HDEL', KEYS[1], 'd:' .. id, 'db:' .. id, 'dl:' .. id, 't:' .. id)
return 1
