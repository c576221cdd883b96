#!/usr/bin/env bash
# Validate docker-compose.yml with whichever Compose is installed: the docker-compose
# command (1.x or 2.x) or the "docker compose" plugin. Needs no Docker engine. Exits 0
# with a message when neither is installed nor installable.
set -euo pipefail
cd "$(dirname "$0")/.."

file=docker-compose.yml

# Without any Compose, install the distribution's docker-compose where apt-get can (as root
# or with sudo); it validates files without a Docker engine.
if ! command -v docker-compose >/dev/null 2>&1 && ! { command -v docker >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; } && command -v apt-get >/dev/null 2>&1; then
	sudo=()
	[ "$(id -u)" -eq 0 ] || sudo=(sudo -n)
	echo "docker-compose not installed; installing it with apt-get"
	if ! { "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
		"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose; } >/dev/null 2>&1; then
		echo "apt-get could not install docker-compose"
	fi
fi

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
