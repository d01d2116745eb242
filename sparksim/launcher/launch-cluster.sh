#!/bin/bash
#
# launch-cluster.sh: run vLLM in Docker across DGX Spark nodes over the ConnectX-7 fabric
# (head = this node, workers over passwordless SSH), with or without a Ray cluster.
#
# A look-alike of the community launcher, eugr/spark-vllm-docker launch-cluster.sh at
# commit 013cd2ea2264d7af8567aa763ac6ccd8f0338c1a (with autodiscover.sh at 065fb920):
# same command line, output lines and container model:
#   launch-cluster.sh [-n IP,IP] [-t IMAGE] [--name NAME] [--eth-if IF] [--ib-if DEV[,DEV]]
#                     [--nccl-debug [LEVEL]] [--check-config] [--solo] [--ray|--no-ray]
#                     [--config FILE] [-d] [start|stop|status|exec CMD...]
# - every node runs `docker run -d --rm --name NAME ... sleep infinity`; Ray and vLLM are
#   started inside with `docker exec`, so a vLLM crash leaves the container running and
#   `stop` removes it (--rm);
# - no Ray by default: `exec vllm serve ...` starts one rank per node with `--nnodes N
#   --node-rank R --master-addr HEAD --master-port 29501` (`--headless` on workers), the
#   workers first, all writing to their container's PID-1 output (`docker logs`); without
#   -d the launcher follows the head's container log until the head's command exits;
# - `--ray`: a Ray cluster (`ray start` per node, port 29501) and `--distributed-executor-
#   backend ray`; the head's `vllm serve` then runs in the foreground (`docker exec -i`), its
#   output on the launcher's stdout, not in `docker logs`;
# - the nodes are trimmed to TP x PP x DP of the command; interface auto-detection needs
#   exactly 2 (or 4: mesh) RoCE devices Up; `.env` beside the script (or --config) sets
#   CLUSTER_NODES, ETH_IF, IB_IF, MASTER_PORT, CONTAINER_NAME, LOCAL_IP, CONTAINER_*.
# - `--launch-script FILE`: the serve command as a script, copied into each container as
#   /workspace/exec-script.sh (no Ray: one copy per node, its last line patched with the
#   node's --nnodes/--node-rank/...; Ray: the head's, with the backend added) and run there;
# - `--non-privileged`: cgroup limits instead of --privileged (--memory 110g, --memory-swap
#   120g, --pids-limit 4096, --shm-size=64g; --mem-limit-gb & co. change them);
#   `--device=/dev/infiniband` only where the node has that directory.
# Left out (not needed to serve on a Spark pair): --apply-mod, --apply-vllm-pr,
# --setup, -p/-v, subnet peer scanning by GPU
# name, the image-ID consistency check. Nothing in it is specific to sparksim: the simulated
# nodes supply ibdev2netdev, ip, ssh and docker, and the image supplies `ray` and `vllm`.
#
# -d goes before the action (`-d exec vllm serve ...`): everything after `exec` is the
# command. Containers always get `--gpus all`, as on a Spark.
#
# --earlyoom / --earlyoom-args ARGS (2026-07-10): the containers' PID 1 is `earlyoom ARGS`
# (default `-M 524288,102400 -s 100 -r 60`, or VLLM_SPARK_EARLYOOM_ARGS) instead of `sleep
# infinity`. HEAD_EXEC_MODE below is this look-alike's switch for the no-Ray head before
# 2026-09-15 ("foreground": `docker exec -i` in the launcher's foreground, its output on the
# launcher's stdout only, no exit file); since then "detached" (the default). As in the real script the exit
# status of `docker run` is not checked: a node whose `docker run` fails (no NVIDIA
# container toolkit: "could not select device driver") is simply left without a container.

IMAGE_NAME="vllm-node"
DEFAULT_CONTAINER_NAME="vllm_node"
HF_CACHE_DIR="${HF_HOME:-$HOME/.cache/huggingface}"
# Extra `docker run` arguments: edit here, or set VLLM_SPARK_EXTRA_DOCKER_ARGS.
DOCKER_ARGS="-e NCCL_IGNORE_CPU_AFFINITY=1"
DOCKER_ARGS="$DOCKER_ARGS -e PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
DOCKER_ARGS="$DOCKER_ARGS -v $HF_CACHE_DIR:/root/.cache/huggingface"
if [[ -n "$VLLM_SPARK_EXTRA_DOCKER_ARGS" ]]; then
    DOCKER_ARGS="$DOCKER_ARGS $VLLM_SPARK_EXTRA_DOCKER_ARGS"
fi

ETH_IF=""
IB_IF=""
NCCL_DEBUG_VAL=""
MASTER_PORT="29501"  # Ray head port, or torch.distributed's master port without Ray
NODES_ARG=""
CONTAINER_NAME="$DEFAULT_CONTAINER_NAME"
COMMAND_TO_RUN=""
DAEMON_MODE="false"
CHECK_CONFIG="false"
SOLO_MODE="false"
NO_RAY_MODE="true"
NO_RAY_EXPLICIT="false"
RAY_MODE_EXPLICIT="false"
MOUNT_CACHE_DIRS="true"
NOFILE_LIMIT="${VLLM_SPARK_NOFILE_LIMIT:-1048576}"
HEAD_EXEC_SENTINEL="/tmp/.launch-cluster-head-exit"
HEAD_EXEC_POLL_INTERVAL=5
HEAD_EXEC_MODE="detached"  # "foreground": the launcher before 2026-09-15
ENABLE_EARLYOOM="false"
EARLYOOM_ARGS="${VLLM_SPARK_EARLYOOM_ARGS:--M 524288,102400 -s 100 -r 60}"
CLUSTER_STOPPED="false"
CONFIG_FILE_SET="false"
MESH_MODE="false"
ACTION=""
CLUSTER_WAS_RUNNING="false"
CONFIG_FILE=""
SCRIPT_DIR="$(dirname "$(realpath "$0")")"
SSH_OPTS=(-o BatchMode=yes -o ConnectTimeout=5)
PEER_NODES=()
LAUNCH_SCRIPT_PATH=""  # --launch-script (recipes run through it)
CONTAINER_EXEC_SCRIPT="/workspace/exec-script.sh"
NON_PRIVILEGED_MODE="false"  # --non-privileged (eugr 2026-02-17) and its limits
MEM_LIMIT_GB="110"
MEM_SWAP_LIMIT_GB=""
PIDS_LIMIT="4096"
SHM_SIZE_GB="64"
MEM_FLAGS_GIVEN=()

usage() {
    echo "Usage: $0 [-n <node_ips>] [-t <image_name>] [--name <container_name>] [--eth-if <if_name>] [--ib-if <if_name>] [--nccl-debug <level>] [--check-config] [--solo] [--ray|--no-ray] [-d] [action] [command]"
    echo "  -n, --nodes     Comma-separated list of node IPs (Optional, auto-detected if omitted)"
    echo "  -t              Docker image name (Optional, default: $IMAGE_NAME)"
    echo "  --name          Container name (Optional, default: $DEFAULT_CONTAINER_NAME)"
    echo "  --eth-if        Ethernet interface (Optional, auto-detected)"
    echo "  --ib-if         InfiniBand interface (Optional, auto-detected)"
    echo "  -e, --env       Environment variable to pass to container (e.g. -e VAR=val)"
    echo "  --nccl-debug    NCCL debug level (Optional, one of: VERSION, WARN, INFO, TRACE). If no level is provided, defaults to INFO."
    echo "  --check-config  Check configuration and auto-detection without launching"
    echo "  --solo          Solo mode: skip autodetection, launch only on current node, do not launch Ray cluster"
    echo "  --master-port   Port for cluster coordination: Ray head port or PyTorch distributed master port (default: 29501)"
    echo "  --ray           Use Ray for multi-node vLLM and add --distributed-executor-backend ray if missing"
    echo "  --no-ray        Default for multi-node vLLM without Ray (accepted for compatibility)"
    echo "  --no-cache-dirs Do not mount default cache directories (~/.cache/vllm, ~/.cache/flashinfer, ~/.triton, ~/.tilelang)"
    echo "  --earlyoom      Run earlyoom as the container's PID 1 instead of sleep infinity"
    echo "  --earlyoom-args earlyoom arguments (implies --earlyoom; default: $EARLYOOM_ARGS)"
    echo "  -d              Daemon mode (start: return once the cluster is up; exec: run the command in the background, logging to the container output)"
    echo "  --config        Path to .env configuration file (default: .env in script directory)"
    echo "  action          start | stop | status | exec (Default: start)"
    echo "  command         Command to run (only for 'exec' action)"
    echo ""
    echo "Environment: VLLM_SPARK_EXTRA_DOCKER_ARGS  extra 'docker run' arguments"
    echo "  VLLM_SPARK_NOFILE_LIMIT  Docker nofile ulimit for containers (default: 1048576)"
    echo "Do not pass --distributed-executor-backend, --nnodes, --node-rank, --master-addr,"
    echo "  --master-port or --headless to vllm serve: the launcher adds them."
    echo "Supported .env variables: CLUSTER_NODES, ETH_IF, IB_IF, MASTER_PORT, CONTAINER_NAME,"
    echo "  LOCAL_IP, CONTAINER_* (CONTAINER_NCCL_DEBUG=INFO -> -e NCCL_DEBUG=INFO)"
    exit 1
}

# --- arguments ------------------------------------------------------------------------
while [[ "$#" -gt 0 ]]; do
    case $1 in
        -n|--nodes) NODES_ARG="$2"; shift ;;
        -t) IMAGE_NAME="$2"; shift ;;
        --name) CONTAINER_NAME="$2"; shift ;;
        --eth-if) ETH_IF="$2"; shift ;;
        --ib-if) IB_IF="$2"; shift ;;
        -e|--env) DOCKER_ARGS="$DOCKER_ARGS -e $2"; shift ;;
        --nccl-debug)
            if [[ -n "$2" && "$2" =~ ^(VERSION|WARN|INFO|TRACE)$ ]]; then
                NCCL_DEBUG_VAL="$2"
                shift
            else
                NCCL_DEBUG_VAL="INFO"
            fi
            ;;
        --master-port|--head-port) MASTER_PORT="$2"; shift ;;
        --check-config) CHECK_CONFIG="true" ;;
        --solo) SOLO_MODE="true" ;;
        --ray)
            if [[ "$NO_RAY_EXPLICIT" == "true" ]]; then
                echo "Error: --ray and --no-ray are mutually exclusive."
                exit 1
            fi
            NO_RAY_MODE="false"; RAY_MODE_EXPLICIT="true" ;;
        --no-ray)
            if [[ "$RAY_MODE_EXPLICIT" == "true" ]]; then
                echo "Error: --ray and --no-ray are mutually exclusive."
                exit 1
            fi
            NO_RAY_MODE="true"; NO_RAY_EXPLICIT="true" ;;
        --no-cache-dirs) MOUNT_CACHE_DIRS="false" ;;
        --launch-script) LAUNCH_SCRIPT_PATH="$2"; shift ;;
        --non-privileged) NON_PRIVILEGED_MODE="true" ;;
        --mem-limit-gb) MEM_LIMIT_GB="$2"; MEM_FLAGS_GIVEN+=("$1"); shift ;;
        --mem-swap-limit-gb) MEM_SWAP_LIMIT_GB="$2"; MEM_FLAGS_GIVEN+=("$1"); shift ;;
        --pids-limit) PIDS_LIMIT="$2"; MEM_FLAGS_GIVEN+=("$1"); shift ;;
        --shm-size-gb) SHM_SIZE_GB="$2"; MEM_FLAGS_GIVEN+=("$1"); shift ;;
        -d) DAEMON_MODE="true" ;;
        --earlyoom) ENABLE_EARLYOOM="true" ;;
        --earlyoom-args) ENABLE_EARLYOOM="true"; EARLYOOM_ARGS="$2"; shift ;;
        -h|--help) usage ;;
        --config) CONFIG_FILE="$2"; CONFIG_FILE_SET="true"; shift ;;
        start|stop|status) ACTION="$1" ;;
        exec)
            ACTION="exec"
            shift
            COMMAND_TO_RUN=$(printf "%q " "$@")
            break
            ;;
        *)
            echo "Error: Unknown argument or action: $1"
            usage
            ;;
    esac
    shift
done

# --- --launch-script, --non-privileged ---------------------------------------------------
if [[ -n "$LAUNCH_SCRIPT_PATH" ]]; then
    if [[ -n "$ACTION" ]]; then
        echo "Error: Action '$ACTION' is not compatible with --launch-script. Please omit the action or not use --launch-script."
        exit 1
    fi
    for candidate in "$LAUNCH_SCRIPT_PATH" "$SCRIPT_DIR/examples/$LAUNCH_SCRIPT_PATH" \
        "$SCRIPT_DIR/examples/$LAUNCH_SCRIPT_PATH.sh"; do
        if [[ -f "$candidate" ]]; then LAUNCH_SCRIPT_PATH="$(realpath "$candidate")"; break; fi
    done
    if [[ ! -f "$LAUNCH_SCRIPT_PATH" ]]; then
        echo "Error: Launch script not found: $LAUNCH_SCRIPT_PATH"
        exit 1
    fi
    echo "Using launch script: $LAUNCH_SCRIPT_PATH"
    ACTION="exec"
    COMMAND_TO_RUN="$CONTAINER_EXEC_SCRIPT"
fi
if [[ "$NON_PRIVILEGED_MODE" != "true" && ${#MEM_FLAGS_GIVEN[@]} -gt 0 ]]; then
    echo "Error: ${MEM_FLAGS_GIVEN[0]} can only be used with --non-privileged"
    exit 1
fi
[[ -z "$MEM_SWAP_LIMIT_GB" ]] && MEM_SWAP_LIMIT_GB=$((MEM_LIMIT_GB + 10))

# --- .env -------------------------------------------------------------------------------
[[ -z "$CONFIG_FILE" ]] && CONFIG_FILE="$SCRIPT_DIR/.env"
if [[ "$CONFIG_FILE_SET" == "true" && ! -f "$CONFIG_FILE" ]]; then
    echo "Error: Config file not found: $CONFIG_FILE"
    exit 1
fi
if [[ -f "$CONFIG_FILE" ]]; then
    echo "Loading configuration from .env file..."
    line_num=0
    declare -A seen_keys=()
    while IFS= read -r line || [[ -n "$line" ]]; do
        line_num=$((line_num + 1))
        line="${line#"${line%%[![:space:]]*}"}"
        [[ -z "$line" || "$line" == \#* ]] && continue
        if [[ "$line" != *=* ]]; then
            echo "Error: Invalid syntax at line $line_num: missing \"=\""
            echo "Error: Invalid .env file syntax. Aborting."
            exit 1
        fi
        key="${line%%=*}"; key="${key%"${key##*[![:space:]]}"}"
        value="${line#*=}"; value="${value#"${value%%[![:space:]]*}"}"
        value="${value%"${value##*[![:space:]]}"}"
        if [[ ! "$key" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
            echo "Error: Invalid key format at line $line_num: $key"
            echo "Error: Invalid .env file syntax. Aborting."
            exit 1
        fi
        if [[ ( "$value" == \"*\" || "$value" == \'*\' ) && ${#value} -ge 2 ]]; then
            value="${value:1:${#value}-2}"
        fi
        if [[ -n "${seen_keys[$key]}" ]]; then
            echo "Error: Duplicate key at line $line_num: $key"
            echo "Error: Invalid .env file syntax. Aborting."
            exit 1
        fi
        seen_keys[$key]=1
        export "DOTENV_$key=$value"
    done < "$CONFIG_FILE"
    echo "Loaded .env variables: $(compgen -v DOTENV_ | tr '\n' ' ')"
fi
[[ -z "$NODES_ARG" && -n "$DOTENV_CLUSTER_NODES" ]] && NODES_ARG="$DOTENV_CLUSTER_NODES"
[[ -z "$ETH_IF" && -n "$DOTENV_ETH_IF" ]] && ETH_IF="$DOTENV_ETH_IF"
[[ -z "$IB_IF" && -n "$DOTENV_IB_IF" ]] && IB_IF="$DOTENV_IB_IF"
[[ "$MASTER_PORT" == "29501" && -n "$DOTENV_MASTER_PORT" ]] && MASTER_PORT="$DOTENV_MASTER_PORT"
if [[ "$CONTAINER_NAME" == "$DEFAULT_CONTAINER_NAME" && -n "$DOTENV_CONTAINER_NAME" ]]; then
    CONTAINER_NAME="$DOTENV_CONTAINER_NAME"
fi
[[ -n "$DOTENV_LOCAL_IP" ]] && LOCAL_IP="$DOTENV_LOCAL_IP"

if [[ -n "$NCCL_DEBUG_VAL" ]]; then
    DOCKER_ARGS="$DOCKER_ARGS -e NCCL_DEBUG=$NCCL_DEBUG_VAL"
fi
if [[ ! "$NOFILE_LIMIT" =~ ^[1-9][0-9]*$ ]]; then
    echo "Error: VLLM_SPARK_NOFILE_LIMIT must be a positive integer, got: $NOFILE_LIMIT"
    exit 1
fi
for env_var in $(compgen -v DOTENV_CONTAINER_); do
    [[ "$env_var" == "DOTENV_CONTAINER_NAME" ]] && continue
    DOCKER_ARGS="$DOCKER_ARGS -e ${env_var#DOTENV_CONTAINER_}=$(printf '%q' "${!env_var}")"
    echo "Adding container env: ${env_var#DOTENV_CONTAINER_}"
done
CACHE_DIRS_TO_CREATE=()
if [[ "$MOUNT_CACHE_DIRS" == "true" ]]; then
    for cache in .cache/vllm .cache/flashinfer .triton .tilelang; do
        DOCKER_ARGS="$DOCKER_ARGS -v $HOME/$cache:/root/$cache"
        CACHE_DIRS_TO_CREATE+=("$HOME/$cache")
    done
fi

# --- auto-detection ---------------------------------------------------------------------
detect_interfaces() {
    [[ -n "$ETH_IF" && -n "$IB_IF" ]] && return 0
    if ! command -v ibdev2netdev &> /dev/null; then
        echo "Error: ibdev2netdev not found. Cannot auto-detect interfaces."
        return 1
    fi
    echo "Auto-detecting interfaces..."
    # "rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)" -> "rocep1s0f1 enp1s0f1np1"
    local pairs ib_devs=() net_devs=() ib_dev net_dev cidr subnet
    mapfile -t pairs < <(ibdev2netdev | awk '/Up\)/ {print $1 " " $5}')
    if [[ ${#pairs[@]} -eq 0 ]]; then
        echo "Error: No active IB interfaces found."
        return 1
    fi
    for pair in "${pairs[@]}"; do
        read -r ib_dev net_dev <<< "$pair"
        ib_devs+=("$ib_dev")
        net_devs+=("$net_dev")
    done
    # The domain-0 twins (enp*, no capital P) carry the fabric addresses: they need one.
    for net_dev in "${net_devs[@]}"; do
        if [[ "$net_dev" == enp* && "$net_dev" != *P* ]] \
            && ! ip addr show "$net_dev" 2>/dev/null | grep -q "inet "; then
            echo "Error: Interface $net_dev (enp*, no capital P) is Up but has no IP address assigned."
            return 1
        fi
    done
    declare -A subnets=()
    for net_dev in "${net_devs[@]}"; do
        cidr=$(ip -o -f inet addr show "$net_dev" 2>/dev/null | awk '{print $4}' | head -n1)
        [[ -z "$cidr" ]] && continue
        subnet=$(python3 -c "import ipaddress, sys; print(ipaddress.ip_network(sys.argv[1], strict=False))" "$cidr" 2>/dev/null)
        if [[ -n "${subnets[$subnet]}" ]]; then
            echo "Error: Interfaces $net_dev and ${subnets[$subnet]} share the same subnet ($subnet). Check network configuration."
            return 1
        fi
        subnets[$subnet]="$net_dev"
    done
    if [[ ${#pairs[@]} -eq 2 ]]; then
        MESH_MODE="false"
        echo "  Non-mesh mode: 2 CX7 interfaces active."
        if [[ -z "$IB_IF" ]]; then
            IB_IF=$(IFS=,; echo "${ib_devs[*]}")
            echo "  Detected IB_IF: $IB_IF"
        fi
        if [[ -z "$ETH_IF" ]]; then
            local with_ip=()
            for net_dev in "${net_devs[@]}"; do
                ip addr show "$net_dev" 2>/dev/null | grep -q "inet " && with_ip+=("$net_dev")
            done
            if [[ ${#with_ip[@]} -eq 0 ]]; then
                echo "Error: No active IB-associated interfaces have IP addresses."
                return 1
            fi
            for net_dev in "${with_ip[@]}"; do  # prefer the twin without a capital P
                if [[ "$net_dev" != *P* ]]; then ETH_IF="$net_dev"; break; fi
            done
            [[ -z "$ETH_IF" ]] && ETH_IF="${with_ip[0]}"
            echo "  Detected ETH_IF: $ETH_IF"
        fi
    elif [[ ${#pairs[@]} -eq 4 ]]; then
        MESH_MODE="true"
        echo "  Mesh mode: all 4 CX7 interfaces active."
        if [[ -z "$IB_IF" ]]; then
            IB_IF="rocep1s0f0,roceP2p1s0f0,rocep1s0f1,roceP2p1s0f1"
            echo "  Detected IB_IF: $IB_IF"
        fi
        if [[ -z "$ETH_IF" ]]; then
            if ip addr show enP7s7 2>/dev/null | grep -q "inet "; then
                ETH_IF="enP7s7"
                echo "  Detected ETH_IF: $ETH_IF"
            elif ip addr show wlP9s9 2>/dev/null | grep -q "inet "; then
                ETH_IF="wlP9s9"
                echo "  Detected ETH_IF: $ETH_IF"
                echo "  Warning: using wireless interface (wlP9s9) for cluster coordination. Performance may be limited."
            else
                echo "Error: Mesh mode requires enP7s7 or wlP9s9 to be up with an IP address for cluster coordination."
                return 1
            fi
        fi
    else
        echo "Error: Unexpected number of active CX7 interfaces (${#pairs[@]}). Expected 2 (non-mesh) or 4 (mesh)."
        return 1
    fi
}

detect_local_ip() {
    [[ -n "$LOCAL_IP" ]] && return 0
    if [[ -z "$ETH_IF" ]]; then
        detect_interfaces || return 1
    fi
    CIDR=$(ip -o -f inet addr show "$ETH_IF" | awk '{print $4}' | head -n 1)
    if [[ -z "$CIDR" ]]; then
        echo "Error: Could not determine IP/CIDR for interface $ETH_IF"
        return 1
    fi
    LOCAL_IP=${CIDR%/*}
    echo "  Detected Local IP: $LOCAL_IP ($CIDR)"
}

detect_nodes() {
    detect_local_ip || return 1
    local node found
    PEER_NODES=()
    if [[ -n "$NODES_ARG" ]]; then
        IFS=',' read -ra found <<< "$NODES_ARG"
        for node in "${found[@]}"; do
            node="${node//[[:space:]]/}"
            [[ -n "$node" && "$node" != "$LOCAL_IP" ]] && PEER_NODES+=("$node")
        done
        return 0
    fi
    echo "Auto-detecting nodes..."
    echo "  Scanning for SSH peers on $CIDR..."
    local tmp ip prefix="${LOCAL_IP%.*}"
    tmp=$(mktemp)
    if [[ "${CIDR#*/}" != "24" ]]; then
        echo "  Note: scanning only $prefix.0/24"
    fi
    for i in $(seq 1 254); do
        ip="$prefix.$i"
        [[ "$ip" == "$LOCAL_IP" ]] && continue
        ( timeout 1 bash -c "exec 3<>/dev/tcp/$ip/22" 2>/dev/null && echo "$ip" >> "$tmp" ) &
    done
    wait
    local detected=("$LOCAL_IP")
    while read -r ip; do
        detected+=("$ip")
        PEER_NODES+=("$ip")
        echo "  Found peer: $ip"
    done < <(sort -t . -k4,4n "$tmp")
    rm -f "$tmp"
    NODES_ARG=$(printf '%s\n' "${detected[@]}" | sort -t . -k4,4n | paste -sd, -)
    echo "  Cluster Nodes: $NODES_ARG"
}

if [[ "$SOLO_MODE" == "true" ]]; then
    [[ -z "$LOCAL_IP" ]] && LOCAL_IP="127.0.0.1"
    NODES_ARG="$LOCAL_IP"
    PEER_NODES=()
    echo "Solo mode enabled. Skipping node detection."
else
    detect_interfaces || exit 1
    detect_nodes || exit 1
fi

if [[ -z "$NODES_ARG" ]]; then
    echo "Error: Nodes argument (-n) is mandatory or could not be auto-detected."
    usage
fi

HEAD_IP="$LOCAL_IP"
FOUND_HEAD=false
IFS=',' read -r -a ALL_NODES <<< "$NODES_ARG"
for ip in "${ALL_NODES[@]}"; do
    [[ "${ip//[[:space:]]/}" == "$HEAD_IP" ]] && FOUND_HEAD=true
done
if [[ "$FOUND_HEAD" == false ]]; then
    echo "Error: Local IP ($HEAD_IP) is not in the list of nodes ($NODES_ARG)."
    exit 1
fi
if [[ "$SOLO_MODE" == "false" && ${#PEER_NODES[@]} -eq 0 ]]; then
    echo "Only local node detected/configured. Activating solo mode (no Ray cluster)."
    SOLO_MODE="true"
fi
if [[ "$SOLO_MODE" == "true" ]]; then
    if [[ "$RAY_MODE_EXPLICIT" == "true" ]]; then
        echo "Error: --ray is incompatible with --solo or a single-node configuration."
        exit 1
    fi
    if [[ "$NO_RAY_EXPLICIT" == "true" ]]; then
        echo "Error: --no-ray is incompatible with --solo or a single-node configuration."
        exit 1
    fi
    NO_RAY_MODE="false"  # one node: neither Ray nor ranks
fi

echo "Head Node: $HEAD_IP"
echo "Worker Nodes: ${PEER_NODES[*]}"
echo "Container Name: $CONTAINER_NAME"
echo "Image Name: $IMAGE_NAME"
echo "Action: $ACTION"

if [[ "$ACTION" == "start" || "$ACTION" == "exec" || "$CHECK_CONFIG" == "true" ]]; then
    if [[ ${#PEER_NODES[@]} -gt 0 ]]; then
        echo "Checking SSH connectivity to worker nodes..."
        for worker in "${PEER_NODES[@]}"; do
            if ! ssh "${SSH_OPTS[@]}" "$worker" true 2>/dev/null; then
                echo "Error: Passwordless SSH to $worker failed."
                echo "  Please ensure SSH keys are configured and the host is reachable."
                exit 1
            fi
            echo "  SSH to $worker: OK"
        done
    fi
fi

if [[ -z "$ACTION" && "$CHECK_CONFIG" != "true" ]]; then
    echo "Error: No action specified. Use: start | stop | status | exec"
    usage
fi

if [[ "$CHECK_CONFIG" == "true" ]]; then
    echo "Configuration Check Complete."
    echo "  Image Name: $IMAGE_NAME"
    echo "  ETH Interface: $ETH_IF"
    echo "  IB Interface: $IB_IF"
    echo "  Docker Args: $DOCKER_ARGS"
    echo "  Docker Network: host"
    if [[ "$MOUNT_CACHE_DIRS" == "true" ]]; then
        echo "  Mounting Cache Dirs: ${CACHE_DIRS_TO_CREATE[*]}"
    else
        echo "  Mounting Cache Dirs: (Disabled)"
    fi
    exit 0
fi

# --- helpers ----------------------------------------------------------------------------
on_worker() {  # on_worker IP CMD [ARGS...]: run a command on a worker, arguments quoted
    local worker="$1"; shift
    ssh "${SSH_OPTS[@]}" "$worker" "$(printf '%q ' "$@")"
}

container_running() {  # container_running [IP]: the container runs on the head / a worker
    if [[ -z "$1" ]]; then
        docker ps --format '{{.Names}}' | grep -qx "$CONTAINER_NAME"
    else
        on_worker "$1" docker ps --format '{{.Names}}' | grep -qx "$CONTAINER_NAME"
    fi
}

cleanup() {
    trap - EXIT INT TERM HUP
    if [[ "$CLUSTER_WAS_RUNNING" == "true" ]]; then
        echo "Cluster was already running when script started. Skipping cleanup."
        return
    fi
    echo ""
    echo "Stopping cluster..."
    echo "Stopping head node ($HEAD_IP)..."
    docker stop "$CONTAINER_NAME" >/dev/null 2>&1 || true
    for worker in "${PEER_NODES[@]}"; do
        echo "Stopping worker node ($worker)..."
        on_worker "$worker" docker stop "$CONTAINER_NAME" >/dev/null 2>&1 || true
    done
    CLUSTER_STOPPED="true"
    echo "Cluster stopped."
}

env_flags() {  # env_flags NODE_IP: the container environment of one node
    printf -- '-e %s ' \
        "VLLM_HOST_IP=$1" \
        "RAY_NODE_IP_ADDRESS=$1" \
        "RAY_OVERRIDE_NODE_IP_ADDRESS=$1" \
        "MN_IF_NAME=$ETH_IF" \
        "UCX_NET_DEVICES=$ETH_IF" \
        "NCCL_SOCKET_IFNAME=$ETH_IF" \
        "NCCL_IB_HCA=$IB_IF" \
        "NCCL_IB_DISABLE=0" \
        "OMPI_MCA_btl_tcp_if_include=$ETH_IF" \
        "GLOO_SOCKET_IFNAME=$ETH_IF" \
        "TP_SOCKET_IFNAME=$ETH_IF" \
        "RAY_memory_monitor_refresh_ms=0" \
        "RAY_num_prestart_python_workers=0" \
        "RAY_object_store_memory=1073741824"
}

check_cluster_running() {
    local running=false
    if container_running; then
        echo "Warning: Container '$CONTAINER_NAME' is already running on head node ($HEAD_IP)."
        running=true
    fi
    for worker in "${PEER_NODES[@]}"; do
        if container_running "$worker"; then
            echo "Warning: Container '$CONTAINER_NAME' is already running on worker node ($worker)."
            running=true
        fi
    done
    if [[ "$running" == "true" ]]; then
        echo "Cluster containers are already running. Skipping launch."
        CLUSTER_WAS_RUNNING="true"
    fi
}

wait_for_cluster() {
    echo "Waiting for cluster to be ready..."
    local count=0
    while [[ $count -lt 30 ]]; do
        if docker exec "$CONTAINER_NAME" ray status >/dev/null 2>&1; then
            echo "Cluster head is responsive."
            sleep 5  # give the workers a moment to connect
            return 0
        fi
        sleep 2
        count=$((count + 1))
    done
    echo "Timeout waiting for cluster to start."
    exit 1
}

container_keepalive_command() {
    if [[ "$ENABLE_EARLYOOM" == "true" ]]; then
        printf 'earlyoom %s' "$EARLYOOM_ARGS"
    else
        printf 'sleep infinity'
    fi
}

start_cluster() {
    check_cluster_running
    [[ "$CLUSTER_WAS_RUNNING" == "true" ]] && return 0

    # shellcheck disable=SC2206  # DOCKER_ARGS is a word list by design
    local common=(--gpus all -d --rm --network host --name "$CONTAINER_NAME" --entrypoint=
                  $DOCKER_ARGS "$IMAGE_NAME")
    local caps=(--privileged --ulimit "nofile=$NOFILE_LIMIT:$NOFILE_LIMIT" --ipc=host)
    if [[ "$NON_PRIVILEGED_MODE" == "true" ]]; then
        echo "Running in non-privileged mode..."
        caps=(--cap-add=IPC_LOCK --ulimit "nofile=$NOFILE_LIMIT:$NOFILE_LIMIT"
              "--shm-size=${SHM_SIZE_GB}g" --memory "${MEM_LIMIT_GB}g"
              --memory-swap "${MEM_SWAP_LIMIT_GB}g" --pids-limit "$PIDS_LIMIT")
        [[ -e /dev/infiniband ]] && caps+=(--device=/dev/infiniband)
    fi
    echo "Starting Head Node on $HEAD_IP..."
    mkdir -p "$HF_CACHE_DIR"
    [[ ${#CACHE_DIRS_TO_CREATE[@]} -gt 0 ]] && mkdir -p "${CACHE_DIRS_TO_CREATE[@]}"
    # As in the real script, a failed `docker run` does not stop the launch.
    # shellcheck disable=SC2046
    # shellcheck disable=SC2207  # the keepalive command is a word list, as in the real script
    local keepalive=($(container_keepalive_command))
    # shellcheck disable=SC2046
    docker run "${caps[@]}" $(env_flags "$HEAD_IP") "${common[@]}" "${keepalive[@]}"
    for worker in "${PEER_NODES[@]}"; do
        echo "Starting Worker Node on $worker..."
        on_worker "$worker" mkdir -p "$HF_CACHE_DIR" "${CACHE_DIRS_TO_CREATE[@]}"
        # shellcheck disable=SC2046
        on_worker "$worker" docker run "${caps[@]}" $(env_flags "$worker") "${common[@]}" "${keepalive[@]}"
    done

    [[ -n "$LAUNCH_SCRIPT_PATH" ]] && copy_launch_scripts

    if [[ "$SOLO_MODE" == "false" && "$NO_RAY_MODE" == "false" ]]; then
        echo "Starting Ray HEAD node on $HEAD_IP..."
        docker exec -d "$CONTAINER_NAME" bash -c \
            "ray start --block --head --port $MASTER_PORT --object-store-memory 1073741824 --num-cpus 2 --node-ip-address $HEAD_IP --include-dashboard=false --disable-usage-stats >> /proc/1/fd/1 2>&1"
        for worker in "${PEER_NODES[@]}"; do
            echo "Starting Ray WORKER node on $worker..."
            on_worker "$worker" docker exec -d "$CONTAINER_NAME" bash -c \
                "ray start --block --object-store-memory 1073741824 --num-cpus 2 --disable-usage-stats --address=$HEAD_IP:$MASTER_PORT --node-ip-address $worker >> /proc/1/fd/1 2>&1"
        done
        wait_for_cluster
    else
        sleep 2
    fi
}

# One node's launch script (a temp file on this host, printed): no Ray, its last line gets
# the node's --nnodes/--node-rank/--master-* (--headless on workers) and loses any
# --distributed-executor-backend; Ray (rank "ray"): --distributed-executor-backend ray.
make_node_script() {
    local nnodes="$1" rank="$2" tmp extra
    tmp=$(mktemp /tmp/vllm_node_script_XXXXXX.sh)
    sed -E 's/--distributed-executor-backend(=|[[:space:]]+)[^[:space:]]+//g' "$LAUNCH_SCRIPT_PATH" \
        | grep -Ev '^[[:space:]\\]*$' > "$tmp"
    sed -i '$ s/[[:space:]]*\\[[:space:]]*$//' "$tmp"
    if [[ "$rank" == "ray" ]]; then
        extra="--distributed-executor-backend ray"
    else
        extra="--nnodes $nnodes --node-rank $rank --master-addr $HEAD_IP --master-port $MASTER_PORT"
        [[ "$rank" -gt 0 ]] && extra="$extra --headless"
    fi
    sed -i "$ s/\$/ $extra/" "$tmp"
    chmod +x "$tmp"
    echo "$tmp"
}

copy_script_into() {  # copy_script_into FILE [IP]: FILE as the container's exec script
    local script="$1" worker="$2" remote
    if [[ -z "$worker" ]]; then
        echo "Copying launch script to head node ($HEAD_IP)..."
        docker exec "$CONTAINER_NAME" mkdir -p "$(dirname "$CONTAINER_EXEC_SCRIPT")"
        docker cp "$script" "$CONTAINER_NAME:$CONTAINER_EXEC_SCRIPT" >/dev/null
        docker exec "$CONTAINER_NAME" chmod +x "$CONTAINER_EXEC_SCRIPT"
        return
    fi
    echo "Copying launch script to worker $worker..."
    remote="/tmp/vllm_script_$(date +%s)_$RANDOM.sh"
    scp "${SSH_OPTS[@]}" -q "$script" "$worker:$remote"
    on_worker "$worker" docker exec "$CONTAINER_NAME" mkdir -p "$(dirname "$CONTAINER_EXEC_SCRIPT")"
    on_worker "$worker" docker cp "$remote" "$CONTAINER_NAME:$CONTAINER_EXEC_SCRIPT" >/dev/null
    on_worker "$worker" docker exec "$CONTAINER_NAME" chmod +x "$CONTAINER_EXEC_SCRIPT"
    on_worker "$worker" rm -f "$remote"
}

# Each kept node's launch script into its container (no Ray: one patched copy per node;
# Ray: the head's alone; one node: the script as it is).
copy_launch_scripts() {
    local total=$((1 + ${#PEER_NODES[@]})) rank=1 worker script
    if [[ "$SOLO_MODE" == "true" ]]; then
        copy_script_into "$LAUNCH_SCRIPT_PATH"
        return
    elif [[ "$NO_RAY_MODE" == "false" ]]; then
        script=$(make_node_script "$total" ray)
        copy_script_into "$script"
        rm -f "$script"
        return
    fi
    script=$(make_node_script "$total" 0)
    copy_script_into "$script"
    rm -f "$script"
    for worker in "${PEER_NODES[@]}"; do
        script=$(make_node_script "$total" "$rank")
        copy_script_into "$script" "$worker"
        rm -f "$script"
        rank=$((rank + 1))
    done
}

# -tp/-pp/-dp (and the long forms, also --flag=N) of a command: TP_SIZE, PP_SIZE, DP_SIZE,
# PARALLELISM_FOUND (true when at least one is given).
parse_parallelism() {
    TP_SIZE=1; PP_SIZE=1; DP_SIZE=1; PARALLELISM_FOUND=false
    local prev="" word
    # shellcheck disable=SC2001
    for word in $(sed 's/\(--[a-z-]*\)=/\1 /g' <<< "$1"); do
        if [[ "$word" =~ ^[0-9]+$ ]]; then
            case "$prev" in
                -tp|--tensor-parallel-size) TP_SIZE="$word"; PARALLELISM_FOUND=true ;;
                -pp|--pipeline-parallel-size) PP_SIZE="$word"; PARALLELISM_FOUND=true ;;
                -dp|--data-parallel-size) DP_SIZE="$word"; PARALLELISM_FOUND=true ;;
            esac
        fi
        prev="$word"
    done
}

# Keep only the nodes the command's TP x PP x DP needs (the head and the first workers).
trim_nodes() {
    [[ "$SOLO_MODE" == "true" || ${#PEER_NODES[@]} -eq 0 ]] && return 0
    parse_parallelism "$1"
    [[ "$PARALLELISM_FOUND" == "true" ]] || return 0
    local required=$((TP_SIZE * PP_SIZE * DP_SIZE)) total=$((1 + ${#PEER_NODES[@]}))
    if [[ $required -gt $total ]]; then
        echo "Error: Command requires $required nodes (tp=$TP_SIZE * pp=$PP_SIZE * dp=$DP_SIZE) but only $total node(s) are configured."
        exit 1
    elif [[ $required -lt $total ]]; then
        echo "Note: Command requires $required node(s) (tp=$TP_SIZE * pp=$PP_SIZE * dp=$DP_SIZE); using $required of $total configured node(s)."
        PEER_NODES=("${PEER_NODES[@]:0:$((required - 1))}")
    fi
}

with_ray_backend() {  # Ray mode: `vllm serve` gets --distributed-executor-backend ray
    if [[ "$1" =~ (^|[[:space:]])vllm[[:space:]]+serve([[:space:]]|$) ]] \
        && [[ ! "$1" =~ --distributed-executor-backend(=|[[:space:]]|$) ]]; then
        echo "Adding --distributed-executor-backend ray for Ray mode." >&2
        printf '%s --distributed-executor-backend ray' "$1"
    else
        printf '%s' "$1"
    fi
}

without_backend() {  # no-Ray mode: the ranks take --nnodes & co. instead of a backend
    sed -E 's/--distributed-executor-backend(=|[[:space:]]+)[^[:space:]]+//g' <<< "$1"
}

exec_on_head() {
    if [[ "$DAEMON_MODE" == "true" ]]; then
        docker exec -d "$CONTAINER_NAME" bash -c "$1 >> /proc/1/fd/1 2>&1"
        echo "Command dispatched in background (Daemon mode). Container: $CONTAINER_NAME"
    else
        local flags="-i"
        [[ -t 0 ]] && flags="-it"
        docker exec $flags "$CONTAINER_NAME" bash -c "$1"
    fi
}

# The head's rank in the background, like the workers' (its output in the container log);
# with a sentinel, the command's exit status is written there when it ends.
exec_on_head_detached() {
    local payload="$1 >> /proc/1/fd/1 2>&1"
    [[ -n "$2" ]] && payload="$payload; echo \$? > $(printf '%q' "$2")"
    if ! docker exec -d "$CONTAINER_NAME" bash -c "$payload"; then
        echo "Error: failed to start the command inside container '$CONTAINER_NAME'." >&2
        return 1
    fi
}

# Follow the head's container log until the sentinel reports the exit status (returned),
# or the container is gone.
wait_for_head_exec() {
    local sentinel="$1" status="" follow
    docker logs -f --since "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$CONTAINER_NAME" 2>/dev/null &
    follow=$!
    while true; do
        status=$(docker exec "$CONTAINER_NAME" cat "$sentinel" 2>/dev/null || true)
        [[ "$status" =~ ^[0-9]+$ ]] && break
        if ! docker ps --format '{{.Names}}' 2>/dev/null | grep -qx "$CONTAINER_NAME"; then
            if [[ "$CLUSTER_STOPPED" != "true" ]]; then
                echo "Container '$CONTAINER_NAME' is no longer running; head command did not report completion." >&2
            fi
            status=1
            break
        fi
        sleep "$HEAD_EXEC_POLL_INTERVAL"
    done
    kill "$follow" 2>/dev/null || true
    wait "$follow" 2>/dev/null || true
    docker exec "$CONTAINER_NAME" rm -f "$sentinel" >/dev/null 2>&1 || true
    return "$status"
}

# No Ray: one rank per node, the workers first (headless, in the background), the head last.
exec_no_ray_cluster() {
    local cmd total=$((1 + ${#PEER_NODES[@]})) rank=1 worker worker_cmd
    cmd=$(without_backend "$1")
    for worker in "${PEER_NODES[@]}"; do
        worker_cmd="$cmd --nnodes $total --node-rank $rank --master-addr $HEAD_IP --master-port $MASTER_PORT --headless"
        [[ -n "$LAUNCH_SCRIPT_PATH" ]] && worker_cmd="$cmd"  # the script is patched per node
        echo "Launching worker (rank $rank) on $worker..."
        on_worker "$worker" docker exec -d "$CONTAINER_NAME" bash -c "$worker_cmd >> /proc/1/fd/1 2>&1"
        rank=$((rank + 1))
    done
    local head_cmd="$cmd --nnodes $total --node-rank 0 --master-addr $HEAD_IP --master-port $MASTER_PORT"
    [[ -n "$LAUNCH_SCRIPT_PATH" ]] && head_cmd="$cmd"
    echo "Executing command on head node (rank 0): $head_cmd"
    if [[ "$DAEMON_MODE" == "true" ]]; then
        exec_on_head_detached "$head_cmd" || return 1
        echo "Command dispatched in background (Daemon mode). Container: $CONTAINER_NAME"
    elif [[ "$HEAD_EXEC_MODE" == "foreground" ]]; then  # before 2026-09-15
        exec_on_head "$head_cmd"
    else
        docker exec "$CONTAINER_NAME" rm -f "$HEAD_EXEC_SENTINEL" >/dev/null 2>&1 || true
        exec_on_head_detached "$head_cmd" "$HEAD_EXEC_SENTINEL" || return 1
        wait_for_head_exec "$HEAD_EXEC_SENTINEL"
    fi
}

# --- actions ----------------------------------------------------------------------------
case "$ACTION" in
    stop)
        cleanup
        exit 0
        ;;
    status)
        echo "Checking status..."
        if container_running; then
            echo "[HEAD] $HEAD_IP: Container '$CONTAINER_NAME' is RUNNING."
            if [[ "$NO_RAY_MODE" == "false" && "$SOLO_MODE" == "false" ]]; then
                echo "--- Ray Status ---"
                docker exec "$CONTAINER_NAME" ray status || echo "Failed to get ray status."
                echo "------------------"
            fi
        else
            echo "[HEAD] $HEAD_IP: Container '$CONTAINER_NAME' is NOT running."
        fi
        for worker in "${PEER_NODES[@]}"; do
            if container_running "$worker"; then
                echo "[WORKER] $worker: Container '$CONTAINER_NAME' is RUNNING."
            else
                echo "[WORKER] $worker: Container '$CONTAINER_NAME' is NOT running."
            fi
        done
        exit 0
        ;;
esac

if [[ "$DAEMON_MODE" == "false" ]]; then
    trap cleanup EXIT INT TERM HUP
fi

if [[ "$ACTION" == "exec" ]]; then
    if [[ "$SOLO_MODE" == "false" && "$NO_RAY_MODE" == "false" && -z "$LAUNCH_SCRIPT_PATH" ]]; then
        COMMAND_TO_RUN=$(with_ray_backend "$COMMAND_TO_RUN")
    fi
    if [[ -n "$LAUNCH_SCRIPT_PATH" ]]; then  # the parallelism flags are in the script
        trim_nodes "$(cat "$LAUNCH_SCRIPT_PATH" 2>/dev/null || true)"
    else
        trim_nodes "$COMMAND_TO_RUN"
    fi
    start_cluster || exit 1
    echo "Executing command: $COMMAND_TO_RUN"
    if [[ "$NO_RAY_MODE" == "true" && ${#PEER_NODES[@]} -gt 0 ]] \
        && { [[ -n "$LAUNCH_SCRIPT_PATH" ]] || grep -q "vllm serve" <<< "$COMMAND_TO_RUN"; }; then
        exec_no_ray_cluster "$COMMAND_TO_RUN"
    else
        exec_on_head "$COMMAND_TO_RUN"
    fi
elif [[ "$ACTION" == "start" ]]; then
    start_cluster || exit 1
    if [[ "$DAEMON_MODE" == "true" ]]; then
        echo "Cluster started in background (Daemon mode)."
    else
        echo "Cluster started. Tailing logs from head node..."
        echo "Press Ctrl+C to stop the cluster."
        docker logs -f "$CONTAINER_NAME" &
        wait $!
    fi
fi
