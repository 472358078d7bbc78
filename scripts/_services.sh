# Sourced by scripts/redis-cluster, scripts/azurite and scripts/pgvector: what `up` does when a server already
# listens on a service's port.
#
# Without CHATKEEP_REQUIRE_OWN_SERVICES, `up` reuses it (a developer's own Redis Cluster or Azurite will do).
# With CHATKEEP_REQUIRE_OWN_SERVICES=1 (.ci/run sets it), only a server this checkout started is reused: its
# pid file (under .services/) names the process that listens on the port. Anything else fails `up`, naming the
# process on the port, so that a CI run never tests against a server some other job or checkout left behind.

# Whether CHATKEEP_REQUIRE_OWN_SERVICES asks for services this checkout started (1, true or yes).
own_services_required() {
    case "$(printf '%s' "${CHATKEEP_REQUIRE_OWN_SERVICES:-}" | tr '[:upper:]' '[:lower:]')" in
        1 | true | yes) return 0 ;;
        *) return 1 ;;
    esac
}

# Whether anything accepts TCP connections on 127.0.0.1:PORT.
port_listens() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# The pids of the processes listening on 127.0.0.1:PORT, one a line, as `ss` shows them (none when it cannot tell).
port_pids() {
    command -v ss >/dev/null 2>&1 || return 0
    ss -Hltnp "sport = :$1" 2>/dev/null | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u || true
}

# What listens on 127.0.0.1:PORT, in words: each process's pid and command line, when `ss` can tell.
port_user() {
    local pids pid described=""
    pids="$(port_pids "$1")"
    for pid in $pids; do
        described="${described:+$described; }pid $pid: $(ps -o args= -p "$pid" 2>/dev/null || echo '(gone)')"
    done
    if [ -z "$described" ]; then
        described="a process this script cannot name: the ss command of iproute2, run as its owner or root, can"
    fi
    echo "$described"
}

# Whether the process of PIDFILE (its first line) is alive and is what listens on 127.0.0.1:PORT. Without `ss`,
# or when it names no process (another user's), a live process whose command line names the port counts.
started_here() {
    local pidfile="$1" port="$2" pid pids
    pid="$(head -n 1 "$pidfile" 2>/dev/null || true)"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
    pids="$(port_pids "$port")"
    if [ -n "$pids" ]; then
        grep -qx "$pid" <<<"$pids"
        return
    fi
    ps -o args= -p "$pid" 2>/dev/null | grep -q -- "$port"
}

# refuse SCRIPT PORT WHY HINT: exits 1, naming the process on PORT, why it is not used (WHY), and, in HINT, how to
# move this service elsewhere.
refuse() {
    echo "scripts/$1: 127.0.0.1:$2 is taken by a server this checkout did not start ($(port_user "$2"))." >&2
    echo "scripts/$1: $3: stop that server, or $4." >&2
    exit 1
}

# reuse_or_refuse SCRIPT PORT PIDFILE HINT: returns when the server on PORT may be reused (this checkout started
# it, or CHATKEEP_REQUIRE_OWN_SERVICES is not set); else refuses it (see refuse).
reuse_or_refuse() {
    if started_here "$3" "$2" || ! own_services_required; then
        return 0
    fi
    refuse "$1" "$2" "CHATKEEP_REQUIRE_OWN_SERVICES is set, so it is not reused" "$4"
}
