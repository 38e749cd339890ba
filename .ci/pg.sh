# A throw-away PostgreSQL server on 127.0.0.1 for the tests (sourced by .ci/run; developers
# can `source .ci/pg.sh && pg_start` too). Needs Debian's postgresql package and root (the
# server itself runs as the postgres user, in a temporary folder, on a free port).
#   pg_start: initdb + start, create user and database, export TUNER_TEST_POSTGRES_URL
#   pg_stop:  stop the server and remove its folder

pg_install() {
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -qq postgresql >/dev/null 2>&1; then
        apt-get update -qq >/dev/null
        apt-get install -y -qq postgresql >/dev/null
    fi
}

pg_start() {
    local bin port pass
    bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    if [ -z "$bin" ]; then
        echo "pg.sh: no PostgreSQL binaries under /usr/lib/postgresql" >&2
        return 1
    fi
    PG_DIR=$(mktemp -d /tmp/tuner-pg.XXXXXX)
    chown postgres "$PG_DIR"
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    pass=$(python3 -c 'import secrets; print(secrets.token_hex(12))')
    runuser -u postgres -- "$bin/initdb" -D "$PG_DIR/data" -U postgres --auth-local=trust \
        --auth-host=scram-sha-256 >"$PG_DIR/initdb.log" 2>&1
    runuser -u postgres -- "$bin/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/server.log" -w \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $PG_DIR -c max_connections=200" start >/dev/null
    runuser -u postgres -- "$bin/psql" -q -h "$PG_DIR" -p "$port" -U postgres -d postgres \
        -c "CREATE USER tuner WITH PASSWORD '$pass'" -c "CREATE DATABASE tuner OWNER tuner" >/dev/null
    PG_BIN=$bin
    export TUNER_TEST_POSTGRES_URL="postgresql://tuner:$pass@127.0.0.1:$port/tuner"
    echo "pg.sh: PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port"
}

pg_stop() {
    if [ -n "${PG_DIR:-}" ] && [ -d "$PG_DIR/data" ]; then
        runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m fast -w stop >/dev/null 2>&1 || true
        rm -rf "$PG_DIR"
    fi
}
