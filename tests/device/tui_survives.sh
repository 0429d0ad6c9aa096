#!/usr/bin/env bash
# Does the console stay up on a real NVIDIA node? Starts `gpuwarden --backend nvml tui --refresh 1` in tmux with
# remain-on-exit, polls for $WATCH_S seconds (default 90); if the pane dies, prints when, its exit status and the
# last screen (Textual prints a traceback there on exit). KEYS="Down Enter" sends those keys KEYS_AT s in (default 5;
# tmux send-keys names), so a view that only opens on a key is exercised too. Touches no GPU setting.
source tests/device/setup.sh
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
WATCH_S=${WATCH_S:-90}
STATE=$(mktemp -d /tmp/gw-surv-XXXX)
SOCK=$STATE/tmux.sock
trap 'tmux -S "$SOCK" kill-server 2>/dev/null' EXIT
tmux -S "$SOCK" new-session -d -s gw -x 160 -y 48
tmux -S "$SOCK" set-option -t gw: remain-on-exit on
tmux -S "$SOCK" respawn-pane -k -t gw: "GPUWARDEN_STATE_DIR=$STATE PYTHONFAULTHANDLER=1 gpuwarden --backend nvml tui --refresh 1 ${TUI_ARGS:-}"
start=$(date +%s)
keys_sent=0
while [ $(( $(date +%s) - start )) -lt "$WATCH_S" ]; do
    dead=$(tmux -S "$SOCK" list-panes -t gw: -F '#{pane_dead} #{pane_dead_status}' 2>/dev/null)
    if [ "${dead%% *}" = 1 ]; then
        echo "console ended after $(( $(date +%s) - start )) s: pane_dead_status ${dead#* }"
        tmux -S "$SOCK" capture-pane -p -S -300 -t gw: | grep -v '^[[:space:]]*$' | tail -80 | tee "$OUT/tui_death.txt"
        exit 1
    fi
    if [ -n "${KEYS:-}" ] && [ $keys_sent = 0 ] && [ $(( $(date +%s) - start )) -ge "${KEYS_AT:-5}" ]; then
        tmux -S "$SOCK" send-keys -t gw: $KEYS; keys_sent=1; echo "sent keys: $KEYS"
    fi
    sleep 1
done
echo "console still up after $WATCH_S s"
tmux -S "$SOCK" capture-pane -p -t gw: | head -8
