"""Summarise a py-spy `--format raw` profile taken with --nonblocking: where the CPU went, by thread and function.

Usage: python3 profile_summary.py FILE.raw RATE_HZ. Device scripts (tui_profile.sh, agent_profile.sh) call it.
"""

import collections
import re
import sys

# --nonblocking cannot tell a thread parked in select/wait from one running: those leaf frames are left out.
IDLE = re.compile(r"\.(select|wait|poll|epoll|accept|recv|recv_into|read|sleep|acquire) \(|^time\.sleep|"
                  r"_wait_for_tstate_lock")


def main(path: str, rate: int) -> None:
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, n_text = line.rstrip().rpartition(" ")
            n = int(n_text)
            frames = stack.split(";")
            if IDLE.search(frames[-1]):
                continue
            total += n
            threads[frames[0].split("):")[-1].strip()] += n
            own[frames[-1]] += n
            for fr in set(frames[1:]):
                incl[fr] += n
    print(f"{total} active samples at {rate} Hz = {total / rate:.2f} s of CPU")
    if not total:
        return
    for t, n in threads.most_common(10):
        print(f"thread {100 * n / total:5.1f}%  {t}")
    print("--- self")
    for fr, n in own.most_common(40):
        print(f"{100 * n / total:5.1f}%  {fr[:160]}")
    print("--- inclusive")
    for fr, n in incl.most_common(90):
        print(f"{100 * n / total:5.1f}%  {fr[:160]}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
