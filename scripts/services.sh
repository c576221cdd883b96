#!/usr/bin/env bash
# Makes sure the services the tests need are running, starting or installing them when
# they are not, and prints the environment the tests should use, for example:
#
#   eval "$(scripts/services.sh)" && go test ./...
#
# The tests need PostgreSQL, MariaDB (or MySQL), NATS with JetStream, RabbitMQ and Apache
# Kafka.
#
# PostgreSQL: TEST_DATABASE_URL names the database (default: the local
# server on 127.0.0.1:5432 as user postgres, without a password). When that server is
# down it is started; when PostgreSQL is not installed it is installed with apt-get; when
# it runs but refuses the password-less login (a fresh Debian install does), a role and
# database outbox_test are created through the postgres system user and used instead.
#
# NATS (NATS_URL, default nats://127.0.0.1:4222) and RabbitMQ (RABBITMQ_URL, default
# amqp://guest:guest@127.0.0.1:5672/): a local server that is down is started, one that
# is not installed is installed with apt-get (Debian's nats-server and rabbitmq-server).
# MariaDB (TEST_MYSQL_URL, default mysql://root@127.0.0.1:3306/test: root without a
# password, as Debian's package lets the system's root user in through the socket): a local
# server that is down is started, one that is not installed is installed with apt-get
# (Debian's mariadb-server); when root may not log in over TCP without a password, a user
# outbox_test and database outbox_test are made through the socket and used instead.
# Apache Kafka (OUTBOX_TEST_KAFKA_BROKERS, default 127.0.0.1:9092): a broker already on
# that port is used; else the server's jars (org.apache.kafka:kafka_2.13 and its runtime
# dependencies) are fetched once from the Maven registry with mvn into
# ${XDG_CACHE_HOME:-~/.cache}/outbox/kafka-<version>, and one KRaft node (broker and
# controller together) runs on the system's Java, 17 or later (Debian's
# default-jre-headless and maven are installed with apt-get when missing). When the jars
# cannot be fetched, the variable is left unset and the Kafka conformance tests say so
# and skip.
# The Temporal CLI (OUTBOX_TEST_TEMPORAL_CLI): the one on PATH, else installed with go
# install into Go's bin folder.
# Progress goes to standard error; only the export lines go to standard output.
set -euo pipefail

default_url="postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
url="${TEST_DATABASE_URL:-$default_url}"
fallback_url="postgres://outbox_test:outbox_test@127.0.0.1:5432/outbox_test?sslmode=disable"

log() { echo "services: $*" >&2; }

as_root() {
	if [ "$(id -u)" -eq 0 ]; then "$@"
	elif command -v sudo >/dev/null 2>&1; then sudo -n "$@"
	else log "need root to run: $*"; return 1
	fi
}

can_connect() { PGCONNECT_TIMEOUT=5 psql "$1" -Atqc 'SELECT 1' >/dev/null 2>&1; }

pg_installed() {
	command -v psql >/dev/null 2>&1 && { command -v pg_ctlcluster >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; }
}

install_pg() {
	log "PostgreSQL is not installed; installing it with apt-get"
	as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
}

start_pg() {
	if pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then return 0; fi
	log "PostgreSQL is not running on 127.0.0.1:5432; starting it"
	if command -v pg_lsclusters >/dev/null 2>&1; then
		local clusters
		clusters=$(pg_lsclusters -h 2>/dev/null | awk '{print $1" "$2}')
		if [ -z "$clusters" ]; then
			local version
			version=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
			as_root pg_createcluster "$version" main >&2
			clusters="$version main"
		fi
		while read -r version name; do
			as_root pg_ctlcluster --skip-systemctl-redirect "$version" "$name" start >&2 || true
		done <<<"$clusters"
	else
		log "pg_ctlcluster is missing: start PostgreSQL on 127.0.0.1:5432 yourself, or set TEST_DATABASE_URL"
		return 1
	fi
	for _ in $(seq 1 60); do
		if pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then return 0; fi
		sleep 0.5
	done
	log "PostgreSQL did not come up on 127.0.0.1:5432 within 30s"
	return 1
}

# create_test_role makes a password login for the tests through the postgres system user,
# for servers that refuse the password-less default.
create_test_role() {
	log "the server refuses $default_url; creating role and database outbox_test"
	local sql="DO \$\$ BEGIN
		IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'outbox_test') THEN
			CREATE ROLE outbox_test LOGIN PASSWORD 'outbox_test';
		END IF; END \$\$;"
	as_root su postgres -c "psql -q -v ON_ERROR_STOP=1 -c \"$sql\"" >&2
	if ! as_root su postgres -c "psql -Atqc \"SELECT 1 FROM pg_database WHERE datname = 'outbox_test'\"" | grep -q 1; then
		as_root su postgres -c "createdb -O outbox_test outbox_test" >&2
	fi
}

# port_open tells whether something listens on 127.0.0.1:$1.
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() {
	local name=$1 port=$2
	for _ in $(seq 1 120); do
		if port_open "$port"; then return 0; fi
		sleep 0.5
	done
	log "$name did not come up on 127.0.0.1:$port within 60s"
	return 1
}

apt_install() {
	log "$1 is not installed; installing it with apt-get"
	as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >&2
}

# ensure_nats starts NATS with JetStream on 127.0.0.1:4222 unless NATS_URL names another
# server.
ensure_nats() {
	local nats_url="${NATS_URL:-nats://127.0.0.1:4222}"
	echo "export NATS_URL='$nats_url'"
	if [ "$nats_url" != "nats://127.0.0.1:4222" ] || port_open 4222; then return 0; fi
	command -v nats-server >/dev/null 2>&1 || [ -x /usr/sbin/nats-server ] || apt_install nats-server
	local bin
	bin=$(command -v nats-server || echo /usr/sbin/nats-server)
	log "NATS is not running on 127.0.0.1:4222; starting it with JetStream"
	as_root mkdir -p /var/lib/nats-server /var/log
	as_root start-stop-daemon --start --oknodo --background --exec "$bin" -- \
		-a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log >&2
	wait_port NATS 4222
}

# ensure_rabbitmq starts RabbitMQ on 127.0.0.1:5672 unless RABBITMQ_URL names another
# broker.
ensure_rabbitmq() {
	local amqp_url="${RABBITMQ_URL:-amqp://guest:guest@127.0.0.1:5672/}"
	echo "export RABBITMQ_URL='$amqp_url'"
	if [ "$amqp_url" != "amqp://guest:guest@127.0.0.1:5672/" ] || port_open 5672; then return 0; fi
	command -v rabbitmq-server >/dev/null 2>&1 || [ -x /usr/sbin/rabbitmq-server ] || apt_install rabbitmq-server
	log "RabbitMQ is not running on 127.0.0.1:5672; starting it"
	# The node may be up with its application stopped (rabbitmqctl stop_app); else start
	# the node.
	if ! as_root env PATH="/usr/sbin:$PATH" rabbitmqctl -q start_app >/dev/null 2>&1; then
		as_root env PATH="/usr/sbin:$PATH" rabbitmq-server -detached >&2 || true
	fi
	wait_port RabbitMQ 5672
}

mysql_default_url="mysql://root@127.0.0.1:3306/test"
mysql_fallback_url="mysql://outbox_test:outbox_test@127.0.0.1:3306/outbox_test"

# mysql_client is the client program: mariadb, or mysql where only that is installed.
mysql_client() { command -v mariadb || command -v mysql || true; }

# mysql_can_connect tells whether user $1 with password $2 reaches database $3 over TCP.
mysql_can_connect() {
	local client
	client=$(mysql_client)
	[ -n "$client" ] && MYSQL_PWD="$2" "$client" --protocol=TCP -h 127.0.0.1 -P 3306 -u "$1" \
		--connect-timeout=5 -e 'SELECT 1' "$3" >/dev/null 2>&1
}

# mysql_zone is the time zone with daylight saving time that the MySQL store's tests run
# business sessions in; mysql_time_zone loads it into the server's time zone tables when
# they lack it (Debian's package leaves them empty).
mysql_zone=America/New_York
mysql_time_zone() {
	local client tzsql
	client=$(mysql_client)
	tzsql=$(command -v mariadb-tzinfo-to-sql || command -v mysql_tzinfo_to_sql || true)
	if [ -z "$client" ] || [ -z "$tzsql" ] || [ ! -f "/usr/share/zoneinfo/$mysql_zone" ]; then
		return 0
	fi
	if mysql_can_connect root "" mysql; then
		mysql_run() { "$client" --protocol=TCP -h 127.0.0.1 -P 3306 -u root "$@"; }
	else
		mysql_run() { as_root "$client" "$@"; }
	fi
	if [ "$(mysql_run -N -e "SELECT COUNT(*) FROM mysql.time_zone_name WHERE Name = '$mysql_zone'" 2>/dev/null)" = 0 ]; then
		log "loading the time zone $mysql_zone into MariaDB's time zone tables"
		"$tzsql" "/usr/share/zoneinfo/$mysql_zone" "$mysql_zone" 2>/dev/null | mysql_run mysql >&2 || true
	fi
}

# ensure_mysql starts (or installs) MariaDB on 127.0.0.1:3306 unless TEST_MYSQL_URL names
# another server.
ensure_mysql() {
	if [ -n "${TEST_MYSQL_URL:-}" ] && [ "$TEST_MYSQL_URL" != "$mysql_default_url" ]; then
		echo "export TEST_MYSQL_URL='$TEST_MYSQL_URL'"
		return 0
	fi
	if ! port_open 3306; then
		[ -x /usr/sbin/mariadbd ] || [ -x /usr/sbin/mysqld ] || apt_install mariadb-server
		local bin=/usr/sbin/mariadbd
		[ -x "$bin" ] || bin=/usr/sbin/mysqld
		log "MariaDB is not running on 127.0.0.1:3306; starting it"
		as_root mkdir -p /run/mysqld
		as_root chown mysql:mysql /run/mysqld 2>/dev/null || true
		# A data directory the package did not initialise (its service was not started
		# during the install) is made first; the server refuses to run as root, so it runs
		# as the mysql user the package created.
		if [ ! -d /var/lib/mysql/mysql ]; then
			local install_db
			install_db=$(command -v mariadb-install-db || command -v mysql_install_db || true)
			[ -n "$install_db" ] && as_root "$install_db" --user=mysql --datadir=/var/lib/mysql >&2
		fi
		as_root start-stop-daemon --start --oknodo --background --exec "$bin" -- --user=mysql >&2
		wait_port MariaDB 3306
	fi
	mysql_time_zone
	# The test database and the root login over TCP; a server that refuses them gets a
	# user of its own, made through the socket as the system's root.
	if mysql_can_connect root "" test; then
		echo "export TEST_MYSQL_URL='$mysql_default_url'"
		return 0
	fi
	if ! mysql_can_connect outbox_test outbox_test outbox_test; then
		log "MariaDB refuses root without a password over TCP; creating user and database outbox_test"
		as_root "$(mysql_client)" -e "CREATE DATABASE IF NOT EXISTS outbox_test;
			CREATE USER IF NOT EXISTS 'outbox_test'@'%' IDENTIFIED BY 'outbox_test';
			CREATE USER IF NOT EXISTS 'outbox_test'@'localhost' IDENTIFIED BY 'outbox_test';
			GRANT ALL ON *.* TO 'outbox_test'@'%'; GRANT ALL ON *.* TO 'outbox_test'@'localhost';" >&2
	fi
	if mysql_can_connect outbox_test outbox_test outbox_test; then
		echo "export TEST_MYSQL_URL='$mysql_fallback_url'"
		return 0
	fi
	log "cannot connect to MariaDB at 127.0.0.1:3306: set TEST_MYSQL_URL to a server the tests may create databases on"
	return 1
}

# kafka_version is the Apache Kafka server ensure_kafka runs.
kafka_version=4.4.0

# ensure_kafka runs one Apache Kafka node in KRaft mode on 127.0.0.1:9092 (its controller
# on 9093) unless OUTBOX_TEST_KAFKA_BROKERS names brokers or one listens there already. It
# runs as the calling user, from a folder of its own under the user's cache; nothing is
# started as root. Failing to provide a broker is not an error of this script: the tests
# that need one skip, naming the variable.
ensure_kafka() {
	if [ -n "${OUTBOX_TEST_KAFKA_BROKERS:-}" ]; then
		echo "export OUTBOX_TEST_KAFKA_BROKERS='$OUTBOX_TEST_KAFKA_BROKERS'"
		return 0
	fi
	if port_open 9092; then
		echo "export OUTBOX_TEST_KAFKA_BROKERS='127.0.0.1:9092'"
		return 0
	fi
	local home="${XDG_CACHE_HOME:-$HOME/.cache}/outbox/kafka-$kafka_version"
	if [ ! -f "$home/libs/kafka_2.13-$kafka_version.jar" ]; then
		command -v java >/dev/null 2>&1 || apt_install default-jre-headless || return 0
		command -v mvn >/dev/null 2>&1 || apt_install maven || return 0
		log "fetching Apache Kafka $kafka_version's jars from the Maven registry into $home/libs"
		mkdir -p "$home"
		cat >"$home/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>outbox.test</groupId>
  <artifactId>kafka-server</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>$kafka_version</version>
    </dependency>
  </dependencies>
</project>
POM
		rm -rf "$home/libs.partial"
		if ! timeout 900 mvn -B -q -Dstyle.color=never -f "$home/pom.xml" \
			org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
			-DincludeScope=runtime -DoutputDirectory="$home/libs.partial" >"$home/mvn.log" 2>&1; then
			log "cannot fetch Apache Kafka $kafka_version from the Maven registry ($home/mvn.log: $(sed 's/\x1b\[[0-9;]*m//g' "$home/mvn.log" | grep -m1 'ERROR' | cut -c1-160)); the Kafka conformance tests will skip"
			return 0
		fi
		rm -rf "$home/libs" && mv "$home/libs.partial" "$home/libs"
	fi
	local java_major
	java_major=$(java -XshowSettings:properties -version 2>&1 | awk -F'= ' '/java.specification.version/ {print $2}')
	if [ "${java_major%%.*}" -lt 17 ] 2>/dev/null; then
		log "Apache Kafka $kafka_version needs Java 17 or later, and java is $java_major; the Kafka conformance tests will skip"
		return 0
	fi
	cat >"$home/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:9093
listeners=PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093
advertised.listeners=PLAINTEXT://127.0.0.1:9092
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$home/data
num.partitions=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
PROPS
	local java_args=(-Xms256m -Xmx512m -cp "$home/libs/*")
	if [ ! -f "$home/data/meta.properties" ]; then
		local cluster_id
		cluster_id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
		if ! java "${java_args[@]}" kafka.tools.StorageTool format -t "$cluster_id" -c "$home/server.properties" >"$home/format.log" 2>&1; then
			log "formatting Kafka's storage failed ($home/format.log); the Kafka conformance tests will skip"
			return 0
		fi
	fi
	log "Apache Kafka is not running on 127.0.0.1:9092; starting one KRaft node from $home"
	setsid nohup java "${java_args[@]}" kafka.Kafka "$home/server.properties" >"$home/kafka.log" 2>&1 </dev/null &
	if ! wait_port Kafka 9092; then
		log "see $home/kafka.log; the Kafka conformance tests will skip"
		return 0
	fi
	echo "export OUTBOX_TEST_KAFKA_BROKERS='127.0.0.1:9092'"
}

# temporal_cli_version is the Temporal CLI the tests run outbox dev with.
temporal_cli_version=v1.5.1

# ensure_temporal_cli provides the Temporal CLI, whose development server outbox dev runs
# when it is on PATH (the quick-start test runs that path): a temporal on PATH, else the one
# in Go's bin folder, else one installed there with go install (from the Go module proxy, a
# few minutes the first time). Its path goes to OUTBOX_TEST_TEMPORAL_CLI; PATH is left
# alone, so the other tests run outbox dev without it.
ensure_temporal_cli() {
	local bin
	bin=$(command -v temporal || true)
	if [ -z "$bin" ]; then
		bin="$(go env GOPATH)/bin/temporal"
		if [ ! -x "$bin" ]; then
			log "the Temporal CLI is not installed; installing $temporal_cli_version into $(dirname "$bin") with go install"
			GOFLAGS= GOBIN="$(dirname "$bin")" go install "github.com/temporalio/cli/cmd/temporal@$temporal_cli_version" >&2
		fi
	fi
	echo "export OUTBOX_TEST_TEMPORAL_CLI='$bin'"
}

main() {
	ensure_mysql
	ensure_nats
	ensure_rabbitmq
	ensure_kafka
	ensure_temporal_cli
	if can_connect "$url"; then
		echo "export TEST_DATABASE_URL='$url'"
		return 0
	fi
	pg_installed || install_pg
	if [ "$url" = "$default_url" ] || [[ "$url" == *"@127.0.0.1:5432/"* ]] || [[ "$url" == *"@localhost:5432/"* ]]; then
		start_pg
	fi
	if can_connect "$url"; then
		echo "export TEST_DATABASE_URL='$url'"
		return 0
	fi
	if [ -z "${TEST_DATABASE_URL:-}" ]; then
		if can_connect "$fallback_url" || { create_test_role && can_connect "$fallback_url"; }; then
			echo "export TEST_DATABASE_URL='$fallback_url'"
			return 0
		fi
	fi
	log "cannot connect to PostgreSQL at $url: set TEST_DATABASE_URL to a database the tests may create schemas in"
	return 1
}

main
