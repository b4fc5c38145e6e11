-- wrk script for benches/scaleout.sh: the worker token comes from the
-- environment, never from wrk's command line.
local token = os.getenv("SCALEOUT_WORKER_TOKEN")
if token == nil or token == "" then
    error("SCALEOUT_WORKER_TOKEN is not set")
end
wrk.headers["Authorization"] = "Bearer " .. token
