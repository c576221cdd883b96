#!/usr/bin/env bash
# Validate docker-compose.yml with whichever Compose is installed: the docker-compose
# command (1.x or 2.x) or the "docker compose" plugin. Needs no Docker engine. Exits 0
# with a message when neither is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

file=docker-compose.yml
if command -v docker-compose >/dev/null 2>&1; then
	cmd=(docker-compose -f "$file" config -q)
elif command -v docker >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; then
	cmd=(docker compose -f "$file" config -q)
else
	echo "docker-compose not installed; skipped compose check"
	exit 0
fi

echo "+ ${cmd[*]}"
"${cmd[@]}"
echo "$file is valid"
