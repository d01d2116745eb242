#!/bin/bash
#
# launch-cluster.sh: run vLLM in Docker across DGX Spark nodes, with a Ray cluster over
# the ConnectX-7 fabric (head = this node, workers over passwordless SSH).
#
# Same command line and behaviour as the community spark-vllm-docker launcher:
#   launch-cluster.sh [-n IP,IP] [-t IMAGE] [--name NAME] [--eth-if IF] [--ib-if DEV[,DEV]]
#                     [--nccl-debug [LEVEL]] [--check-config] [-d] [start|stop|status|exec CMD...]
# Nothing in it is specific to sparksim: the simulated nodes supply ibdev2netdev, ip, ssh and
# docker, and the image supplies `ray` and `vllm`.
#
# -d goes before the action (`-d exec vllm serve ...`): everything after `exec` is the
# command. Containers always get `--gpus all`, as on a Spark; a node without the NVIDIA
# container toolkit fails its `docker run` ("could not select device driver"), and the
# launcher stops there with the node named.

IMAGE_NAME="vllm-node"
DEFAULT_CONTAINER_NAME="vllm_node"
HF_CACHE_DIR="${HF_HOME:-$HOME/.cache/huggingface}"
# Extra `docker run` arguments: edit here, or set VLLM_SPARK_EXTRA_DOCKER_ARGS.
DOCKER_ARGS="-e NCCL_IGNORE_CPU_AFFINITY=1 -v $HF_CACHE_DIR:/root/.cache/huggingface"
if [[ -n "$VLLM_SPARK_EXTRA_DOCKER_ARGS" ]]; then
    DOCKER_ARGS="$DOCKER_ARGS $VLLM_SPARK_EXTRA_DOCKER_ARGS"
fi

ETH_IF=""
IB_IF=""
NCCL_DEBUG_VAL=""
RAY_PORT="6379"
DASHBOARD_PORT="8265"
NODES_ARG=""
CONTAINER_NAME="$DEFAULT_CONTAINER_NAME"
COMMAND_TO_RUN=""
DAEMON_MODE="false"
CHECK_CONFIG="false"
SOLO_MODE="false"
NO_RAY_MODE="false"
ACTION=""
CLUSTER_WAS_RUNNING="false"
CONFIG_FILE=""
SCRIPT_DIR="$(dirname "$(realpath "$0")")"
SSH_OPTS=(-o BatchMode=yes -o ConnectTimeout=5)
PEER_NODES=()

usage() {
    echo "Usage: $0 [-n <node_ips>] [-t <image_name>] [--name <container_name>] [--eth-if <if_name>] [--ib-if <if_name>] [--nccl-debug <level>] [--check-config] [--solo] [--no-ray] [-d] [action] [command]"
    echo "  -n, --nodes     Comma-separated list of node IPs (Optional, auto-detected if omitted)"
    echo "  -t              Docker image name (Optional, default: $IMAGE_NAME)"
    echo "  --name          Container name (Optional, default: $DEFAULT_CONTAINER_NAME)"
    echo "  --eth-if        Ethernet interface (Optional, auto-detected)"
    echo "  --ib-if         InfiniBand interface (Optional, auto-detected)"
    echo "  -e, --env       Environment variable to pass to container (e.g. -e VAR=val)"
    echo "  --nccl-debug    NCCL debug level (Optional, one of: VERSION, WARN, INFO, TRACE). If no level is provided, defaults to INFO."
    echo "  --check-config  Check configuration and auto-detection without launching"
    echo "  --solo          Solo mode: skip autodetection, launch only on current node, do not launch Ray cluster"
    echo "  --master-port   Ray head port (default: $RAY_PORT)"
    echo "  --no-ray        Do not start a Ray cluster in the containers"
    echo "  --ray           Start a Ray cluster (default; accepted for compatibility)"
    echo "  -d              Daemon mode (start: return once the cluster is up; exec: run the command in the background, logging to the container output)"
    echo "  --config        Path to .env configuration file (default: .env in script directory)"
    echo "  action          start | stop | status | exec (Default: start)"
    echo "  command         Command to run (only for 'exec' action)"
    echo ""
    echo "Environment: VLLM_SPARK_EXTRA_DOCKER_ARGS  extra 'docker run' arguments"
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
        --master-port|--head-port) RAY_PORT="$2"; shift ;;
        --check-config) CHECK_CONFIG="true" ;;
        --solo) SOLO_MODE="true" ;;
        --no-ray) NO_RAY_MODE="true" ;;
        --ray) NO_RAY_MODE="false" ;;
        -d) DAEMON_MODE="true" ;;
        -h|--help) usage ;;
        --config) CONFIG_FILE="$2"; shift ;;
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

# --- .env -------------------------------------------------------------------------------
[[ -z "$CONFIG_FILE" ]] && CONFIG_FILE="$SCRIPT_DIR/.env"
if [[ -f "$CONFIG_FILE" ]]; then
    echo "Loading configuration from .env file..."
    line_num=0
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
        export "DOTENV_$key=$value"
    done < "$CONFIG_FILE"
    echo "Loaded .env variables: $(compgen -v DOTENV_ | tr '\n' ' ')"
fi
[[ -z "$NODES_ARG" && -n "$DOTENV_CLUSTER_NODES" ]] && NODES_ARG="$DOTENV_CLUSTER_NODES"
[[ -z "$ETH_IF" && -n "$DOTENV_ETH_IF" ]] && ETH_IF="$DOTENV_ETH_IF"
[[ -z "$IB_IF" && -n "$DOTENV_IB_IF" ]] && IB_IF="$DOTENV_IB_IF"
[[ "$RAY_PORT" == "6379" && -n "$DOTENV_MASTER_PORT" ]] && RAY_PORT="$DOTENV_MASTER_PORT"
if [[ "$CONTAINER_NAME" == "$DEFAULT_CONTAINER_NAME" && -n "$DOTENV_CONTAINER_NAME" ]]; then
    CONTAINER_NAME="$DOTENV_CONTAINER_NAME"
fi
[[ -n "$DOTENV_LOCAL_IP" ]] && LOCAL_IP="$DOTENV_LOCAL_IP"

if [[ -n "$NCCL_DEBUG_VAL" ]]; then
    DOCKER_ARGS="$DOCKER_ARGS -e NCCL_DEBUG=$NCCL_DEBUG_VAL"
fi
for env_var in $(compgen -v DOTENV_CONTAINER_); do
    [[ "$env_var" == "DOTENV_CONTAINER_NAME" ]] && continue
    DOCKER_ARGS="$DOCKER_ARGS -e ${env_var#DOTENV_CONTAINER_}=$(printf '%q' "${!env_var}")"
    echo "Adding container env: ${env_var#DOTENV_CONTAINER_}"
done

# --- auto-detection ---------------------------------------------------------------------
detect_interfaces() {
    [[ -n "$ETH_IF" && -n "$IB_IF" ]] && return 0
    if ! command -v ibdev2netdev &> /dev/null; then
        echo "Error: ibdev2netdev not found. Cannot auto-detect interfaces."
        return 1
    fi
    echo "Auto-detecting interfaces..."
    # "rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)" -> "rocep1s0f1 enp1s0f1np1"
    local pairs ib_devs=() eth_candidates=() ib_dev net_dev
    mapfile -t pairs < <(ibdev2netdev | awk '/\(Up\)/ {print $1 " " $5}')
    if [[ ${#pairs[@]} -eq 0 ]]; then
        echo "Error: No active IB interfaces found."
        return 1
    fi
    for pair in "${pairs[@]}"; do
        read -r ib_dev net_dev <<< "$pair"
        ib_devs+=("$ib_dev")
        if ip -o -f inet addr show "$net_dev" 2>/dev/null | grep -q "inet "; then
            eth_candidates+=("$net_dev")
        fi
    done
    if [[ -z "$IB_IF" ]]; then
        IB_IF=$(IFS=,; echo "${ib_devs[*]}")
        echo "  Detected IB_IF: $IB_IF"
    fi
    if [[ -z "$ETH_IF" ]]; then
        if [[ ${#eth_candidates[@]} -eq 0 ]]; then
            echo "Error: No active IB-associated interfaces have IP addresses."
            return 1
        fi
        # Prefer the domain-0 twin (no capital P in its name).
        for iface in "${eth_candidates[@]}"; do
            if [[ "$iface" != *P* ]]; then ETH_IF="$iface"; break; fi
        done
        [[ -z "$ETH_IF" ]] && ETH_IF="${eth_candidates[0]}"
        echo "  Detected ETH_IF: $ETH_IF"
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

[[ -z "$ACTION" ]] && ACTION="start"
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

if [[ "$CHECK_CONFIG" == "true" ]]; then
    echo "Configuration Check Complete."
    echo "  Image Name: $IMAGE_NAME"
    echo "  ETH Interface: $ETH_IF"
    echo "  IB Interface: $IB_IF"
    echo "  Docker Args: $DOCKER_ARGS"
    echo "  Docker Network: host"
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
        "MASTER_ADDR=$HEAD_IP" \
        "RAY_memory_monitor_refresh_ms=0"
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

start_cluster() {
    check_cluster_running
    [[ "$CLUSTER_WAS_RUNNING" == "true" ]] && return

    # shellcheck disable=SC2206  # DOCKER_ARGS is a word list by design
    local common=(--privileged --gpus all -d --rm --network host --ipc=host
                  --name "$CONTAINER_NAME" --entrypoint= $DOCKER_ARGS "$IMAGE_NAME")
    echo "Starting Head Node on $HEAD_IP..."
    mkdir -p "$HF_CACHE_DIR"
    # shellcheck disable=SC2046
    if ! docker run $(env_flags "$HEAD_IP") "${common[@]}" sleep infinity; then
        echo "Error: Failed to start container '$CONTAINER_NAME' on head node ($HEAD_IP)."
        exit 1
    fi
    for worker in "${PEER_NODES[@]}"; do
        echo "Starting Worker Node on $worker..."
        on_worker "$worker" mkdir -p "$HF_CACHE_DIR"
        # shellcheck disable=SC2046
        if ! on_worker "$worker" docker run $(env_flags "$worker") "${common[@]}" sleep infinity; then
            echo "Error: Failed to start container '$CONTAINER_NAME' on worker node ($worker)."
            exit 1
        fi
    done

    if [[ "$SOLO_MODE" == "false" && "$NO_RAY_MODE" == "false" ]]; then
        echo "Starting Ray HEAD node on $HEAD_IP..."
        docker exec -d "$CONTAINER_NAME" bash -c \
            "ray start --block --head --port $RAY_PORT --dashboard-port $DASHBOARD_PORT --node-ip-address $HEAD_IP --disable-usage-stats >> /proc/1/fd/1 2>&1"
        for worker in "${PEER_NODES[@]}"; do
            echo "Starting Ray WORKER node on $worker..."
            on_worker "$worker" docker exec -d "$CONTAINER_NAME" bash -c \
                "ray start --block --address=$HEAD_IP:$RAY_PORT --node-ip-address $worker --disable-usage-stats >> /proc/1/fd/1 2>&1"
        done
        wait_for_cluster
    else
        sleep 2
    fi
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
    start_cluster
    echo "Executing command: $COMMAND_TO_RUN"
    exec_on_head "$COMMAND_TO_RUN"
elif [[ "$ACTION" == "start" ]]; then
    start_cluster
    if [[ "$DAEMON_MODE" == "true" ]]; then
        echo "Cluster started in background (Daemon mode)."
    else
        echo "Cluster started. Tailing logs from head node..."
        echo "Press Ctrl+C to stop the cluster."
        docker logs -f "$CONTAINER_NAME" &
        wait $!
    fi
fi
