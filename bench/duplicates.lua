-- wrk: one new idempotency key in 64 (the rest are duplicates), 1 KB JSON body.
local counter = 0
local body = '{"type":"order.paid","data":{"note":"' .. string.rep("x", 960) .. '"}}'
-- Unique per thread and run: each wrk thread has its own Lua state (and table addresses).
local run = os.time() .. "-" .. string.sub(tostring({}), 8)
function request()
  counter = counter + 1
  return wrk.format("POST", wrk.path, {["Content-Type"] = "application/json",
    ["Idempotency-Key"] = run .. "-" .. math.floor(counter / 64)}, body)
end
