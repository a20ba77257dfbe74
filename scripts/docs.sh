#!/usr/bin/env bash
# `make docs`: rewrites the generated blocks of docs/reference/flags.md from the binary's own help. Each block sits
# between `<!-- help: <subcommand words> -->` and `<!-- /help -->` and holds, in a text code block,
# `migration-apiserver <subcommand words> --help` with trailing whitespace removed. tests/docs.rs checks that the
# file matches the binary. Usage: scripts/docs.sh <migration-apiserver binary>.
set -euo pipefail
bin=${1:?usage: scripts/docs.sh <migration-apiserver binary>}
root=$(cd "$(dirname "$0")/.." && pwd)
doc="$root/docs/reference/flags.md"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
inside=0
while IFS= read -r line || [ -n "$line" ]; do
  if [ "$inside" = 1 ]; then
    [ "$line" = '<!-- /help -->' ] || continue
    inside=0
  fi
  printf '%s\n' "$line" >> "$out"
  if [[ $line =~ ^'<!-- help: '(.+)' -->'$ ]]; then
    read -r -a words <<< "${BASH_REMATCH[1]}"
    {
      echo '```text'
      "$bin" "${words[@]}" --help | sed 's/[[:space:]]*$//'
      echo '```'
    } >> "$out"
    inside=1
  fi
done < "$doc"
[ "$inside" = 0 ] || { echo "$doc: a <!-- help: ... --> block without <!-- /help -->" >&2; exit 1; }
cp "$out" "$doc"
