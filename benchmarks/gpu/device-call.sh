# Sourced, from the repository root, by the scripts that make one device call (benchmarks/perf.sh,
# benchmarks/reliability.sh), with OUT set: the same start for every call.
#   - $LOGS = $OUT/logs; what the script prints also goes to $OUT/summary.txt
#   - the offline bundle's packages, with this checkout first on PYTHONPATH (keep the bundle's
#     entries: replacing PYTHONPATH hides cutlass and array_api_compat, and every case fails)
#   - the carried kernel cache ($CACHE_TAR, default .cache/xgemm-cache.tar.xz) unpacked into /tmp/xc
#   - the GPU's SM clock, power, temperature and clock-event reasons every half second into
#     $LOGS/smi.csv, for `clocks START END` (benchmarks/gpu/clocks.py) to summarize a stretch
# pack_logs, at the end: every log and JSON into $OUT/logs.tar.xz, since the device tool brings back
# only a few files from $OUT.
LOGS=$OUT/logs
mkdir -p "$LOGS"
exec > >(tee "$OUT/summary.txt") 2>&1
source .gpu/use-bundle .gpu
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p /tmp/xc && tar -xJf "${CACHE_TAR:-.cache/xgemm-cache.tar.xz}" -C /tmp/xc && export XGEMM_CACHE_DIR=/tmp/xc

# the reasons' field name changed in newer drivers; the UTC timestamps match `date +%s`
smi_fields=timestamp,clocks.sm,power.draw,temperature.gpu
for reasons in clocks_event_reasons.active clocks_throttle_reasons.active; do
  nvidia-smi --query-gpu=$smi_fields,$reasons --format=csv,noheader > /dev/null 2>&1 && break
done
TZ=UTC nvidia-smi --query-gpu=$smi_fields,$reasons --format=csv,nounits -lms 500 > "$LOGS/smi.csv" 2>&1 &
smi_pid=$!
clocks() { python3 benchmarks/gpu/clocks.py "$LOGS/smi.csv" "$1" "$2"; }

# xz on every core at its fastest level, so that packing takes seconds (reliability.sh's calls that
# came back without logs hung in a bare `wait` on this file's tee, not in xz)
pack_logs() { kill $smi_pid 2>/dev/null; tar -cf - -C "$LOGS" . | xz -T0 -1 > "$OUT/logs.tar.xz" && rm -rf "$LOGS"; }
