#!/usr/bin/env bash
# gpushare on a real NVIDIA GPU host: one prepared check, under 8 minutes, that leaves the host
# as it found it. See docs/gpu-check.md.
#
#   sudo tests/gpu/check.sh                     # a host with an NVIDIA GPU and PyTorch (CUDA)
#   sudo tests/gpu/check.sh --simulate PROFILE  # the daemon part only, on a simulated node
#
# What it does: starts gpushared on NVML with compute-mode and time-slice management switched
# off (so it never changes compute mode, time-slice or MIG), prints the NVML inventory,
# compares gpushare's MIG profile tables with what NVML reports of each MIG-capable GPU,
# prepares an MPS claim at 100 % active threads and measures a compute-bound kernel, prepares
# one at 25 % with a 2 GiB pinned device memory limit, runs two CUDA clients on it (shown by
# the control daemon's get_server_list and ps), measures the same kernel, tries an allocation
# beyond the limit, starts a container on an MPS claim's CDI device IDs (the driver's device
# from NVIDIA's toolkit spec, then the claim's) through gpushare-runtime and runc and runs a
# CUDA client in it (where the host has runc and the NVIDIA Container Toolkit; else that step
# is skipped with its reason), then releases everything and checks that nothing is left and
# no GPU setting changed. Ends with a short table.
#
# Exit status: 0 every check passed; 1 a check failed; 2 no GPU on this host (nothing was
# run); 3 a prerequisite is missing (root, PyTorch with CUDA, nvidia-cuda-mps-control, the
# gpushare binaries).
#
# Environment: GPUSHARE_BIN_DIR (gpushared, gpushare; default target/release or target/debug
# of this checkout, built with cargo when neither has them; gpushare-runtime there too for the
# container step), GPUSHARE_CHECK_PYTHON (default
# python3), GPUSHARE_CHECK_KEEP=1 keeps the work directory, GPUSHARE_CHECK_LIMIT (seconds,
# default 450) bounds the whole run.

set -uo pipefail

readonly EXIT_FAILED=1 EXIT_NO_GPU=2 EXIT_PREREQ=3
MODE=real
PROFILE=""
case "${1:-}" in
    "") ;;
    --simulate) MODE=sim; PROFILE="${2:-p4d.24xlarge}" ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "check.sh: unknown argument ${1}; see --help" >&2; exit "$EXIT_PREREQ" ;;
esac

say() { echo "check: $*" >&2; }
die_prereq() { echo "check.sh: $*" >&2; exit "$EXIT_PREREQ"; }

# 1. Is there a GPU at all? Decided first, so that a GPU-less host gets one clear line.
if [[ $MODE == real ]]; then
    if [[ ! -e /dev/nvidiactl ]] || ! command -v nvidia-smi >/dev/null 2>&1 \
        || ! timeout 30 nvidia-smi -L >/dev/null 2>&1; then
        echo "check.sh: no GPU: this host has no NVIDIA driver or GPU (/dev/nvidiactl, nvidia-smi -L); nothing was run. Without a GPU, 'tests/gpu/check.sh --simulate p4d.24xlarge' checks the daemon part." >&2
        exit "$EXIT_NO_GPU"
    fi
fi

[[ $(id -u) == 0 ]] || die_prereq "must run as root (MPS control daemons, mounts); try sudo"
PY="${GPUSHARE_CHECK_PYTHON:-python3}"
command -v "$PY" >/dev/null 2>&1 || die_prereq "$PY not found (set GPUSHARE_CHECK_PYTHON)"
if [[ $MODE == real ]]; then
    timeout 120 "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
        || die_prereq "$PY has no PyTorch with CUDA (import torch; torch.cuda.is_available())"
    command -v nvidia-cuda-mps-control >/dev/null 2>&1 \
        || die_prereq "nvidia-cuda-mps-control not in PATH (it ships with the NVIDIA driver)"
fi

REPO="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="${GPUSHARE_BIN_DIR:-}"
if [[ -z $BIN ]]; then
    for d in "$REPO/target/release" "$REPO/target/debug"; do
        if [[ -x $d/gpushared && -x $d/gpushare ]]; then BIN=$d; break; fi
    done
fi
if [[ -z $BIN ]]; then
    command -v cargo >/dev/null 2>&1 || die_prereq "no gpushared/gpushare binaries and no cargo to build them (set GPUSHARE_BIN_DIR)"
    say "building gpushare (release)"
    (cd "$REPO" && timeout 300 cargo build --release --locked -p gpushare -p gpushare-cli -p gpushare-mps-control -p gpushare-runtime >&2) \
        || die_prereq "cargo build failed"
    BIN="$REPO/target/release"
fi
MPS_CONTROL=$(command -v nvidia-cuda-mps-control || true)
if [[ -z $MPS_CONTROL ]]; then
    MPS_CONTROL="$BIN/gpushare-mps-control"  # --simulate on a host without NVIDIA's program
fi

# The driver's CDI spec comes from NVIDIA's toolkit (nvidia-ctk cdi generate); without it
# gpushared would refuse every claim, so the check then runs with [cdi] driver_spec = "none"
# and skips the container step, saying why.
TOOLKIT=""
if [[ $MODE == sim ]] || command -v nvidia-ctk >/dev/null 2>&1; then
    TOOLKIT=yes
fi

# A short path: MPS and gpushared sockets live below it (108-byte limit).
WORK=$(mktemp -d /tmp/gsck.XXXXXX)
TABLE="$WORK/table"
: >"$TABLE"
FAILED=0
DAEMON_PID=""
CLAIMS=()
CLIENT_PIDS=()
row() { printf '%-60s %s\n' "$1" "$2" >>"$TABLE"; }
pass() { row "$1" "ok${2:+ ($2)}"; }
fail() { row "$1" "FAILED${2:+ ($2)}"; FAILED=1; }

gs() { timeout 120 "$BIN/gpushare" --socket "$WORK/s" --timeout 90 "$@"; }
json() { "$PY" -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

cleanup() {
    local pid uid
    [[ -n ${WATCHDOG:-} ]] && kill "$WATCHDOG" 2>/dev/null
    for pid in "${CLIENT_PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null; done
    if [[ -n $DAEMON_PID ]]; then
        for uid in "${CLAIMS[@]}"; do [[ -n $uid ]] && gs unprepare "$uid" >/dev/null 2>&1; done
        kill -TERM "$DAEMON_PID" 2>/dev/null
        timeout 20 tail --pid="$DAEMON_PID" -f /dev/null 2>/dev/null
        kill -KILL "$DAEMON_PID" 2>/dev/null
    fi
    if [[ ${GPUSHARE_CHECK_KEEP:-} == 1 ]]; then
        say "work directory kept: $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# The whole check is bounded: past the limit it stops, and cleanup still releases everything.
LIMIT="${GPUSHARE_CHECK_LIMIT:-450}"
(
    # The sleep holds none of our output pipes, and dies with the watchdog.
    sleep "$LIMIT" </dev/null >/dev/null 2>&1 &
    trap 'kill $! 2>/dev/null; exit 0' TERM
    wait $!
    echo "check.sh: still running after $LIMIT s; stopping and cleaning up" >&2
    kill -TERM $$
) </dev/null >/dev/null &
WATCHDOG=$!

settings() {
    # Everything gpushare could change on a GPU, as the driver reports it.
    if [[ $MODE == real ]]; then
        timeout 30 nvidia-smi --query-gpu=index,uuid,compute_mode,mig.mode.current --format=csv,noheader
    else
        gs gpus -o json | json '"\n".join(",".join(str(g[k]) for k in ("name", "compute_mode", "time_slice")) for g in d)'
    fi
}

# 2. gpushared on NVML (or the simulated profile), never touching GPU settings.
{
    echo "[paths]"
    echo "socket = \"$WORK/s\""
    echo "state_dir = \"$WORK/state\""
    echo "run_dir = \"$WORK/run\""
    echo "cdi_dir = \"$WORK/cdi\""
    echo "[node]"
    echo "name = \"gpushare-check\""
    echo "[mps]"
    echo "control = \"$MPS_CONTROL\""
    echo "shm_size_mib = 2048"
    echo "[gpus]"
    echo "manage_compute_mode = false"
    echo "manage_time_slice = false"
    [[ $MODE == sim ]] && echo "simulate = \"$PROFILE\""
    echo "[cdi]"
    if [[ -n $TOOLKIT ]]; then echo "driver_spec = \"toolkit\""; else echo "driver_spec = \"none\""; fi
} >"$WORK/config.toml"
"$BIN/gpushared" --config "$WORK/config.toml" </dev/null 2>"$WORK/gpushared.log" &
DAEMON_PID=$!
for _ in $(seq 1 300); do
    [[ -S $WORK/s ]] && gs status >/dev/null 2>&1 && break
    kill -0 "$DAEMON_PID" 2>/dev/null || break
    sleep 0.1
done
if ! gs status >/dev/null 2>&1; then
    echo "check.sh: gpushared did not start:" >&2
    tail -n 20 "$WORK/gpushared.log" >&2
    DAEMON_PID=""
    exit "$EXIT_FAILED"
fi
BEFORE=$(settings)

echo "== NVML inventory (gpushare -o wide gpus) =="
# Wide: the inventory of a check includes each GPU's UUID, compute mode and time-slice.
gs -o wide gpus | tee "$WORK/gpus.txt"
GPUS_JSON=$(gs gpus -o json)
SUMMARY=$(json '", ".join(sorted({"%d x %s (%s, CC %s, %d MiB)" % (sum(1 for h in d if h["product_name"] == g["product_name"]), g["product_name"], g["architecture"], g["cuda_compute_capability"], g["memory_mib"]) for g in d})) + "; driver %s, CUDA %s" % (d[0]["driver_version"], d[0]["cuda_driver_version"])' <<<"$GPUS_JSON")
pass "NVML inventory" "$SUMMARY"
# 2b. gpushare's MIG profile tables against what NVML reports (read only:
# nvmlDeviceGetGpuInstanceProfileInfoV and GetGpuInstancePossiblePlacements change nothing and
# need no MIG mode on Hopper): name, memory, SMs, engines and placements of every profile of
# each GPU gpushared offers slices of. Some of the tables' figures are inferred, not read (the
# H200's memory and its 1g.35gb / 4g.71gb SMs, the A100-80GB's memory: daemon/src/mig/mod.rs);
# this is where they are checked. A difference fails the row and prints NVML's figures.
ROW_MIG="MIG profile tables match NVML"
if [[ $MODE == sim ]]; then
    row "$ROW_MIG" "skipped (simulated node: no NVML)"
else
    cat >"$WORK/migprofiles.py" <<'EOF'
import ctypes, json, sys
gpus = json.load(open(sys.argv[1]))
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint) for n in ("version", "id", "isP2pSupported", "sliceCount",
        "instanceCount", "multiprocessorCount", "copyEngineCount", "decoderCount",
        "encoderCount", "jpegCount", "ofaCount")] + [("memorySizeMB", ctypes.c_ulonglong),
        ("name", ctypes.c_char * 96)]
class Placement(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]
nvml = ctypes.CDLL("libnvidia-ml.so.1")
assert nvml.nvmlInit_v2() == 0, "nvmlInit_v2 failed"
problems, checked = [], []
for g in gpus:
    parts = g.get("mig_partitions")
    if not parts or not parts["placements"]:
        continue
    dev = ctypes.c_void_p()
    rc = nvml.nvmlDeviceGetHandleByUUID(g["uuid"].encode(), ctypes.byref(dev))
    if rc:
        problems.append(f'{g["name"]}: nvmlDeviceGetHandleByUUID: error {rc}')
        continue
    ours = {}
    for s in parts["placements"]:
        ours.setdefault(s["gi_profile_id"], {"profile": s["profile"], "capacity": s["capacity"],
            "size": s["memory_slices"], "starts": set()})["starts"].add(s["placement_start"])
    theirs = {}
    for index in range(64):
        info = Info(version=ctypes.sizeof(Info) | (2 << 24))
        rc = nvml.nvmlDeviceGetGpuInstanceProfileInfoV(dev, index, ctypes.byref(info))
        if rc == 2:  # INVALID_ARGUMENT: past the last profile index
            break
        if rc == 3:  # NOT_SUPPORTED: no such profile on this GPU
            continue
        if rc:
            problems.append(f'{g["name"]}: nvmlDeviceGetGpuInstanceProfileInfoV({index}): error {rc}')
            break
        count = ctypes.c_uint(0)
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements_v2(dev, info.id, None, ctypes.byref(count))
        places = (Placement * max(count.value, 1))()
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements_v2(dev, info.id, places, ctypes.byref(count))
        theirs[info.id] = {"profile": info.name.decode().replace("MIG ", "", 1),
            "capacity": {"memory_mib": info.memorySizeMB, "multiprocessors": info.multiprocessorCount,
                "copy_engines": info.copyEngineCount, "decoders": info.decoderCount,
                "encoders": info.encoderCount, "jpeg_engines": info.jpegCount,
                "ofa_engines": info.ofaCount},
            "size": places[0].size if count.value else None,
            "starts": {places[i].start for i in range(count.value)}}
    if not theirs:
        problems.append(f'{g["name"]}: NVML reported no GPU-instance profile')
        continue
    # Instances of the node's layout make gpushared leave placements out: then only what it
    # lists is compared.
    complete = not [m for m in g["mig_devices"] if m.get("owner") is None]
    at = f'{g["name"]} ({g["product_name"]})'
    for pid in sorted(set(ours) | set(theirs)):
        o, t = ours.get(pid), theirs.get(pid)
        if t is None:
            problems.append(f"{at}: profile ID {pid} ({o['profile']}) is not NVML's")
            continue
        if o is None:
            if complete:
                problems.append(f"{at}: NVML's profile ID {pid} is not in gpushare's table: {t['profile']} {t['capacity']} size {t['size']} starts {sorted(t['starts'])}")
            continue
        for k in ("profile", "capacity", "size", "starts"):
            same = o[k] == t[k] or (k == "starts" and not complete and o[k] <= t[k])
            if not same:
                show = (lambda v: sorted(v)) if k == "starts" else (lambda v: v)
                problems.append(f"{at}: profile ID {pid} {k}: gpushare {show(o[k])}, NVML {show(t[k])}")
    checked.append(f'{g["product_name"]}: {len(theirs)} profiles')
print(json.dumps({"checked": sorted(set(checked)), "problems": problems}))
EOF
    echo "$GPUS_JSON" >"$WORK/gpus.json"
    if MIGCMP=$(timeout 60 "$PY" "$WORK/migprofiles.py" "$WORK/gpus.json" 2>"$WORK/migprofiles.err"); then
        MIG_CHECKED=$(json '"; ".join(d["checked"])' <<<"$MIGCMP")
        MIG_PROBLEMS=$(json '"\n".join(d["problems"])' <<<"$MIGCMP")
        if [[ -n $MIG_PROBLEMS ]]; then
            echo "== MIG profile tables: differences from NVML ==" >&2
            echo "$MIG_PROBLEMS" >&2
            fail "$ROW_MIG" "$(wc -l <<<"$MIG_PROBLEMS") difference(s), on stderr"
        elif [[ -z $MIG_CHECKED ]]; then
            row "$ROW_MIG" "skipped (no GPU gpushared offers MIG slices of)"
        else
            pass "$ROW_MIG" "$MIG_CHECKED"
        fi
    else
        fail "$ROW_MIG" "reading NVML: $(tail -n 1 "$WORK/migprofiles.err")"
    fi
fi

DEVICE=$(json 'next((g["name"] for g in d if not g["mig_enabled"]), "")' <<<"$GPUS_JSON")
if [[ -z $DEVICE ]]; then
    fail "a GPU without MIG mode for the MPS claims" "every GPU is in MIG mode"
    cat "$TABLE"
    exit "$EXIT_FAILED"
fi

claim() { # uid atp [pinned limit]
    local limit=""
    [[ -n ${3:-} ]] && limit=",\"defaultPinnedDeviceMemoryLimit\":\"$3\""
    cat >"$WORK/$1.json" <<EOF
{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim",
 "metadata":{"name":"$1","namespace":"gpushare-check","uid":"$1"},
 "status":{"allocation":{"devices":{
   "results":[{"request":"gpu","driver":"gpu.nvidia.com","pool":"gpushare-check","device":"$DEVICE"}],
   "config":[{"source":"FromClaim","requests":["gpu"],"opaque":{"driver":"gpu.nvidia.com","parameters":
     {"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig",
      "sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":$2$limit}}}}}]}}}}
EOF
    CLAIMS+=("$1")
    gs prepare -f "$WORK/$1.json" >&2 || return 1
    gs claim "$1" -o json >"$WORK/$1.info"
}
field() { json "d[\"groups\"][0][\"sharing\"][\"$2\"]" <"$WORK/$1.info"; }
release() {
    local uid=$1 pid dir spec
    pid=$(field "$uid" control_daemon_pid)
    dir=$(dirname "$(field "$uid" pipe_dir)")
    spec=$(json 'd["cdi_spec"]' <"$WORK/$uid.info")
    gs unprepare "$uid" >&2 || return 1
    CLAIMS=("${CLAIMS[@]/$uid}")
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null || [[ -e $dir || -e $spec ]] || grep -q "$dir" /proc/self/mountinfo; then
        echo "left behind after unprepare of $uid: pid $pid, $dir, $spec" >&2
        return 1
    fi
}
mps_ui() { # uid command
    echo "$2" | CUDA_MPS_PIPE_DIRECTORY="$(field "$1" pipe_dir)" timeout 10 "$MPS_CONTROL" 2>&1
}

# The client, as a container would run it: in its own mount namespace with the claim's shm
# directory on /dev/shm and the claim's pipe directory as CUDA_MPS_PIPE_DIRECTORY.
cat >"$WORK/client.py" <<'EOF'
import json, os, sys, time
mode, work, name = sys.argv[1], sys.argv[2], sys.argv[3]
import torch
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
with open(f"{work}/{name}.ready", "w") as f:
    f.write(str(os.getpid()))
deadline = time.time() + 120
while not os.path.exists(f"{work}/go") and time.time() < deadline:
    time.sleep(0.05)
res = {"pid": os.getpid()}
if mode == "bench":
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.float16)
    b = torch.randn(n, n, device="cuda", dtype=torch.float16)
    for _ in range(5):
        a @ b
    torch.cuda.synchronize()
    iters = int(sys.argv[4])
    t = time.perf_counter()
    done = 0
    # iters 0: calibrate, i.e. run for about 3 s and report how many iterations that took.
    while (iters and done < iters) or (not iters and time.perf_counter() - t < 3.0):
        a @ b
        done += 1
        if not iters and done % 10 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    res.update(seconds=time.perf_counter() - t, iters=done)
else:
    within, beyond = int(sys.argv[4]), int(sys.argv[5])
    x = torch.empty(within << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    res["within_ok"] = True
    del x
    torch.cuda.empty_cache()
    try:
        y = torch.empty(beyond << 20, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        res["beyond_failed"] = False
    except RuntimeError as e:
        res["beyond_failed"] = True
        res["error"] = str(e).splitlines()[0][:120]
print(json.dumps(res))
EOF
client() { # uid name args... ; runs in the background, pid in CLIENT_PIDS
    local uid=$1 name=$2
    shift 2
    SHM="$(field "$uid" shm_dir)" PIPE="$(field "$uid" pipe_dir)" \
        timeout 240 unshare --mount --propagation private sh -c \
        'mount --bind "$SHM" /dev/shm && CUDA_MPS_PIPE_DIRECTORY="$PIPE" exec "$0" "$@"' \
        "$PY" "$WORK/client.py" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
    CLIENT_PIDS+=($!)
}
wait_ready() { # names...
    local n
    for _ in $(seq 1 900); do
        n=0
        for f in "$@"; do [[ -s $WORK/$f.ready ]] && n=$((n + 1)); done
        [[ $n == "$#" ]] && return 0
        sleep 0.1
    done
    return 1
}
wait_clients() {
    local ok=0 pid
    for pid in "${CLIENT_PIDS[@]}"; do wait "$pid" || ok=1; done
    CLIENT_PIDS=()
    return $ok
}

# 3. MPS claim at 100 %: the baseline.
if claim gsck-100 100; then
    pass "MPS claim prepared; compute mode/time-slice/MIG untouched" "$DEVICE, active threads $(field gsck-100 active_thread_percentage) read back"
else
    fail "MPS claim prepared; compute mode/time-slice/MIG untouched" "see $WORK/gpushared.log"
fi
T100="" ITERS=""
if [[ $MODE == real ]]; then
    rm -f "$WORK/go"
    client gsck-100 base bench "$WORK" base 0
    wait_ready base && touch "$WORK/go"
    if wait_clients; then
        T100=$(json 'd["seconds"]' <"$WORK/base.out")
        ITERS=$(json 'd["iters"]' <"$WORK/base.out")
    else
        fail "kernel at 100 % active threads" "$(tail -n 1 "$WORK/base.err")"
    fi
fi
release gsck-100 || fail "release of the 100 % claim"

# 4. MPS claim at 25 % with a 2 GiB pinned device memory limit, two clients on its server.
if ! claim gsck-25 25 2Gi; then
    fail "MPS claim at 25 %, pinned limit 2Gi" "see $WORK/gpushared.log"
elif [[ $MODE == sim ]]; then
    pass "MPS claim at 25 %, pinned limit 2Gi" "read back: $(field gsck-25 active_thread_percentage), $(json 'd["groups"][0]["sharing"]["pinned_device_memory_limits"]["0"]' <"$WORK/gsck-25.info")"
    row "two CUDA clients on the claim's MPS server" "skipped (simulated node: no CUDA)"
    row "slowdown at 25 % vs 100 % active threads" "skipped (simulated node: no CUDA)"
    row "allocation beyond the pinned limit fails" "skipped (simulated node: no CUDA)"
    release gsck-25 || fail "release of the 25 % claim"
else
    rm -f "$WORK/go"
    client gsck-25 bench bench "$WORK" bench "${ITERS:-200}"
    client gsck-25 mem mem "$WORK" mem 1024 3072
    if wait_ready bench mem; then
        SERVERS=$(mps_ui gsck-25 get_server_list)
        PS=$(mps_ui gsck-25 ps)
        {
            echo "== get_server_list =="
            echo "$SERVERS"
            echo "== ps =="
            echo "$PS"
        } | tee "$WORK/mps.txt"
        P1=$(cat "$WORK/bench.ready") P2=$(cat "$WORK/mem.ready")
        NSERV=$(grep -cE '^[0-9]+$' <<<"$SERVERS")
        if [[ $NSERV == 1 ]] && grep -qw "$P1" <<<"$PS" && grep -qw "$P2" <<<"$PS"; then
            pass "two CUDA clients on the claim's MPS server" "server $(grep -E '^[0-9]+$' <<<"$SERVERS"), clients $P1 $P2"
        else
            fail "two CUDA clients on the claim's MPS server" "servers: $(tr '\n' ' ' <<<"$SERVERS"); clients $P1 $P2 in ps: see above"
        fi
    else
        fail "two CUDA clients on the claim's MPS server" "clients did not start: $(tail -qn 1 "$WORK/bench.err" "$WORK/mem.err" | tr '\n' ' ')"
    fi
    touch "$WORK/go"
    wait_clients
    if [[ -s $WORK/bench.out && -n $T100 ]]; then
        T25=$(json 'd["seconds"]' <"$WORK/bench.out")
        RATIO=$("$PY" -c "print(f'{$T25/$T100:.2f}')")
        SLOWDOWN="${RATIO}x ($ITERS matmuls 8192^2 fp16: 100 %: $(printf %.2f "$T100") s, 25 %: $(printf %.2f "$T25") s)"
        # 25 % of the SMs: about 4x for a kernel that fills the GPU; under 2x means the
        # limit did not hold.
        if "$PY" -c "import sys; sys.exit(0 if $T25/$T100 >= 2.0 else 1)"; then
            pass "slowdown at 25 % vs 100 % active threads" "$SLOWDOWN"
        else
            fail "slowdown at 25 % vs 100 % active threads" "$SLOWDOWN"
        fi
    else
        fail "slowdown at 25 % vs 100 % active threads" "$(tail -n 1 "$WORK/bench.err")"
    fi
    if [[ -s $WORK/mem.out ]] && [[ $(json 'd.get("within_ok") and d.get("beyond_failed")' <"$WORK/mem.out") == True ]]; then
        pass "allocation beyond the pinned limit fails" "1 GiB ok, 3 GiB refused under 2Gi: $(json 'd["error"]' <"$WORK/mem.out")"
    else
        fail "allocation beyond the pinned limit fails" "$(cat "$WORK/mem.out" 2>/dev/null) $(tail -n 1 "$WORK/mem.err")"
    fi
    release gsck-25 || fail "release of the 25 % claim"
fi

# 5. A container on an MPS claim's CDI device IDs, as the kubelet hands them to the runtime:
# the driver's device (NVIDIA's toolkit spec: libcuda.so, nvidia-smi, its hooks) first, the
# claim's last; applied by gpushare-runtime (the path containerd 1.6 takes) before runc. Its
# CUDA client is the host's python3 with ctypes on the driver's libcuda.so.1: it must find
# exactly the claim's GPU and allocate on it through the claim's MPS server, even though the
# container asks for NVIDIA_VISIBLE_DEVICES=all. On a simulated node the container runs and
# its view is checked, but there is no CUDA to call.
ROW_CTR="container on an MPS claim's CDI IDs runs a CUDA client"
container_skip=""
if [[ -z $TOOLKIT ]]; then
    container_skip="no NVIDIA Container Toolkit (nvidia-ctk) for the driver's CDI spec"
elif ! command -v runc >/dev/null 2>&1; then
    container_skip="no container runtime (runc) on this host"
elif [[ ! -x $BIN/gpushare-runtime ]]; then
    container_skip="no $BIN/gpushare-runtime (cargo build -p gpushare-runtime)"
fi
if [[ -n $container_skip ]]; then
    row "$ROW_CTR" "skipped ($container_skip)"
elif ! claim gsck-ctr 50; then
    fail "$ROW_CTR" "the claim was refused: see $WORK/gpushared.log"
else
    CTR="$WORK/ctr"
    ROOT="$CTR/rootfs"
    mkdir -p "$ROOT"/{etc,tmp,proc,dev,sys}
    PYBIN=$(readlink -f "$("$PY" -c 'import sys; print(sys.executable)')")
    STDLIB=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
    CTYPES=$("$PY" -c 'import _ctypes; print(_ctypes.__file__)')
    put() { mkdir -p "$ROOT$(dirname "$1")" && cp -L "$1" "$ROOT$1"; }
    put "$PYBIN"
    # Given two files, ldd heads each one's list with a "<file>:" line: not a library.
    for lib in $(ldd "$PYBIN" "$CTYPES" 2>/dev/null | grep -v ':$' | grep -o '/[^ ]*' | sort -u); do put "$lib"; done
    IDS=$(json '",".join(d["requests"][0]["cdi_device_ids"])' <"$WORK/gsck-ctr.info")
    MINOR=$(json 'd["groups"][0]["devices"][0]["minor"]' <"$WORK/gsck-ctr.info")
    cat >"$CTR/client.py" <<'EOF'
import ctypes, json, os, sys
out = {"visible": os.environ.get("NVIDIA_VISIBLE_DEVICES"),
       "pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"),
       "control": os.path.exists("/tmp/nvidia-mps/control"),
       "gpus": sorted(n for n in os.listdir("/dev") if n.startswith("nvidia") and n[6:].isdigit())}
libdir = os.environ.get("NVIDIA_CTK_LIBCUDA_DIR", "")
found = [p for p in (os.path.join(libdir, "libcuda.so.1"),) if libdir and os.path.exists(p)]
out["libcuda"] = found[0] if found else "libcuda.so.1"
if sys.argv[1] == "real":
    cuda = ctypes.CDLL(out["libcuda"])
    count, dev, ctx, ptr = ctypes.c_int(), ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    out["cuInit"] = cuda.cuInit(0)
    out["cuDeviceGetCount"] = cuda.cuDeviceGetCount(ctypes.byref(count))
    out["devices"] = count.value
    cuda.cuDeviceGet(ctypes.byref(dev), 0)
    out["cuCtxCreate"] = cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
    out["cuMemAlloc"] = cuda.cuMemAlloc_v2(ctypes.byref(ptr), 64 << 20)
print(json.dumps(out))
EOF
    put "$CTR/client.py"
    (cd "$CTR" && timeout 30 runc spec) >/dev/null 2>&1
    "$PY" - "$CTR/config.json" "$PYBIN" "$CTR/client.py" "$MODE" "$IDS" "$STDLIB" <<'EOF'
import json, sys
path, py, client, mode, ids, stdlib = sys.argv[1:]
with open(path) as f:
    c = json.load(f)
c["process"]["terminal"] = False
c["process"]["args"] = [py, client, mode]
c["process"]["env"] += ["GPUSHARE_VISIBLE_DEVICES=" + ids, "NVIDIA_VISIBLE_DEVICES=all"]
c["root"] = {"path": "rootfs", "readonly": False}
c["mounts"].append({"destination": stdlib, "type": "bind", "source": stdlib, "options": ["rbind", "ro"]})
with open(path, "w") as f:
    json.dump(c, f)
EOF
    cat >"$CTR/runtime.toml" <<EOF
runtimes = ["runc"]
spec_dirs = ["$WORK/cdi"]
log_file = "$CTR/runtime.log"
log_level = "debug"
EOF
    GPUSHARE_RUNTIME_CONFIG="$CTR/runtime.toml" timeout 120 "$BIN/gpushare-runtime" \
        --root "$CTR/state" run --bundle "$CTR" "gsck-ctr-$$" >"$CTR/out" 2>"$CTR/err" </dev/null
    tail -n 1 "$CTR/out" >"$CTR/result.json"
    VERDICT=$("$PY" - "$MODE" "nvidia$MINOR" "$CTR/result.json" <<'EOF' 2>/dev/null
import json, sys
mode, gpu, path = sys.argv[1:]
with open(path) as f:
    d = json.load(f)
ok = (d["visible"] == "void" and d["pipe"] == "/tmp/nvidia-mps" and d["control"]
      and d["gpus"] == [gpu] and d["libcuda"].startswith("/"))
if mode == "real":
    ok = ok and d["cuInit"] == 0 and d["devices"] == 1 and d["cuCtxCreate"] == 0 and d["cuMemAlloc"] == 0
print("ok" if ok else "bad")
EOF
)
    if [[ $VERDICT == ok && $MODE == real ]]; then
        pass "$ROW_CTR" "the driver's libcuda.so.1, only /dev/nvidia$MINOR, the claim's MPS pipe, NVIDIA_VISIBLE_DEVICES=void; cuInit, 1 device, a context and 64 MiB"
    elif [[ $VERDICT == ok ]]; then
        pass "$ROW_CTR" "simulated: the driver's libcuda.so.1, only /dev/nvidia$MINOR, the claim's MPS pipe, NVIDIA_VISIBLE_DEVICES=void; no CUDA to call"
    else
        fail "$ROW_CTR" "the container said: $(cat "$CTR/result.json") $(tail -n 2 "$CTR/err" | tr '\n' ' ')"
    fi
    release gsck-ctr || fail "release of the container's claim"
fi

# 6. Nothing left, nothing changed.
AFTER=$(settings)
kill -TERM "$DAEMON_PID" 2>/dev/null
timeout 20 tail --pid="$DAEMON_PID" -f /dev/null
DAEMON_PID=""
# The node's driver spec (gpushare.io-gpu.json) is not a claim's: it stays, as on a node.
LEFT=$(ls -A "$WORK/run/claims" "$WORK/cdi" 2>/dev/null | grep -v ':$' | grep -v '^gpushare.io-gpu.json$' | grep -c . || true)

if [[ $BEFORE == "$AFTER" && $LEFT == 0 ]]; then
    pass "released; nothing left; GPU settings as found" "$(wc -l <<<"$AFTER") GPU(s) compared"
else
    fail "released; nothing left; GPU settings as found" "left: $LEFT; before: $(tr '\n' ' ' <<<"$BEFORE") after: $(tr '\n' ' ' <<<"$AFTER")"
fi

echo
echo "== gpushare GPU-host check ($MODE${PROFILE:+ $PROFILE}, $(hostname), $(date -u +%Y-%m-%dT%H:%MZ)) =="
cat "$TABLE"
if [[ $FAILED != 0 ]]; then
    GPUSHARE_CHECK_KEEP=1
    exit "$EXIT_FAILED"
fi
exit 0
