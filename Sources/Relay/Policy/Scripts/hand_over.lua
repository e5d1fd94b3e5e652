-- Hands over what the mailbox holds displaced (see leaseDisplaced). KEYS: mailbox. ARGV: now ms,
-- lease ms, owner. Answers {the intent the mailbox holds (parked, else being sent) or '',
-- {id, entry, displaced by, mine, lease end, ...}}.
local m = redis.call('HMGET', KEYS[1], 'pid', 'cid')
return {m[1] or m[2] or '', leaseDisplaced(tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3])}
