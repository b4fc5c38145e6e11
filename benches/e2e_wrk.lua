-- wrk script for benches/e2e_wrk.sh: the worker token comes from the
-- environment (E2E_WRK_AUTH), never the command line.
wrk.headers["Authorization"] = "Bearer " .. os.getenv("E2E_WRK_AUTH")
