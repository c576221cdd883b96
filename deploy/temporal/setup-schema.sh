#!/bin/sh
# Creates the Temporal server's databases (temporal, temporal_visibility) in the stack's
# PostgreSQL and brings their schemas to the version the server image expects. Runs in
# the temporalio/admin-tools image before the server starts; safe to run again.
set -eu

sql() {
	temporal-sql-tool --plugin postgres12 --ep postgres -p 5432 -u postgres --pw "$POSTGRES_PWD" "$@"
}

for db in temporal temporal_visibility; do
	case $db in
	temporal) dir=/etc/temporal/schema/postgresql/v12/temporal/versioned ;;
	*) dir=/etc/temporal/schema/postgresql/v12/visibility/versioned ;;
	esac
	sql --db "$db" create || true # already there on a second start
	sql --db "$db" setup-schema -v 0.0
	sql --db "$db" update-schema -d "$dir"
done
echo "Temporal schemas are up to date"
