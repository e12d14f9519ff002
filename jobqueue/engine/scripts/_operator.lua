--[[ _operator: what the operator scripts (retry.lua, cancel.lua, reprioritize.lua) share: a
call's answer kept a minute in base:op:<call id> (STRING), so that the call sent again after its
reply was lost finds it and answers as it did, where a replay would find the job moved on.
]]

-- Where a call's answer is kept (see above), or nil for a call without an id ('' or none).
local function op_key(base, call_id)
  if (call_id or '') == '' then return nil end
  return base .. ':op:' .. call_id
end

-- Keep a call's answer where op_key says (nowhere when nil), and give it: every exit of an
-- operator script answers through it.
local function answered(op, answer)
  if op then redis.call('SET', op, answer, 'PX', 60000) end
  return answer
end
