#!/usr/bin/env bash
# servertime.sh: the database's CPU time per business transaction, with the client out of
# the picture. For each table named, one backend runs N transactions of the benchmark's
# shape (an order INSERT, then one row into the table: a random UUID, the topic and the
# payload), committed one by one with synchronous_commit off, and the backend's own CPU
# time (user + system, from /proc) over those N transactions (20,000 unless set) is
# divided by N. Every table is measured once per series, in the order given, for SERIES
# series (12 unless set); compare tables within a series.
#
#   benchmarks/enqueue/servertime.sh DATABASE_URL TABLE...
#
# Each table must have the columns message_id, topic and payload. The order goes into the
# table ORDERS names (default orders, created if missing: id bigserial, sku text, qty int).
# Run it on the machine of the database server (it reads the backend's /proc entry).
set -euo pipefail

series=${SERIES:-12}
n=${N:-20000}
orders=${ORDERS:-orders}
if [ $# -lt 2 ]; then
	echo "usage: $0 DATABASE_URL TABLE..." >&2
	exit 64
fi
url=$1
shift
psql "$url" -Atq -v ON_ERROR_STOP=1 -c 'SET client_min_messages = warning' \
	-c "CREATE TABLE IF NOT EXISTS $orders (id bigserial PRIMARY KEY, sku text, qty int)"

# cpu_ticks PID: the process's user + system time in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

hz=$(getconf CLK_TCK)
for s in $(seq 1 "$series"); do
	line="series $s:"
	for table in "$@"; do
		coproc PSQL { PGOPTIONS="-c synchronous_commit=off" psql "$url" -Atq -v ON_ERROR_STOP=1 2>&1; }
		echo 'SELECT pg_backend_pid();' >&"${PSQL[1]}"
		read -r pid <&"${PSQL[0]}"
		before=$(cpu_ticks "$pid")
		cat >&"${PSQL[1]}" <<-SQL
			DO \$\$ BEGIN
			  FOR i IN 1..$n LOOP
			    INSERT INTO $orders (sku, qty) VALUES ('SKU-42', 2);
			    INSERT INTO $table (message_id, topic, payload)
			      VALUES (gen_random_uuid(), 'order.created', '{"order_id":1,"sku":"SKU-42","qty":2}');
			    COMMIT;
			  END LOOP;
			END \$\$;
			SELECT 'done';
		SQL
		read -r done <&"${PSQL[0]}"
		if [ "$done" != done ]; then
			echo "$table: $done" >&2
			exit 1
		fi
		after=$(cpu_ticks "$pid")
		echo '\q' >&"${PSQL[1]}"
		wait "$PSQL_PID" 2>/dev/null || true
		line="$line $table=$(awk -v t=$((after - before)) -v hz="$hz" -v n="$n" 'BEGIN { printf "%.1f", t * 1e6 / hz / n }')µs"
	done
	echo "$line"
done
