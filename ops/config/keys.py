"""Every configuration key gpuwarden reads, declared once: section, name, type, unit, range, default, variable, help.

The loader (ops/config/loader.py) checks and resolves them from this table; `config example` and the reference
table in docs/configuration.md are generated from it (ops/config/reference.py).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: status resolves its options here
if TYPE_CHECKING:
    from typing import Any

# The fastest refresh of anything that samples the node on a timer (the console, the agent, status --watch):
# below it a refresh costs more CPU than it tells (ops/sampling/thread.py enforces it for every sampler).
MIN_REFRESH_S = 0.25
MAX_SECONDS = 1e7  # about 16 weeks: any duration past this is a typo
MAX_GPU_INDEX = 1023
MAX_CONFIG_BYTES = 1 << 20  # a node config is a few KiB: a bigger file is the wrong file
BACKENDS = ("amdsmi", "sysfs", "nvml", "sim")

# Sections, in the order the reference shows them. "global": the command line and the environment only;
# "": the top level of node.toml; "engines": each [[engines]] table and [defaults].
SECTIONS = ("global", "", "arena", "stagger", "engines", "agent", "kubernetes")


class Key:
    """One key. `type` names its check in ops/config/schema.py; low/high bound numbers, sizes and durations
    (in `unit`); `env`/`option` are where the command line and the environment set it (global keys)."""

    __slots__ = ("section", "name", "type", "default", "help", "unit", "low", "high", "choices", "env", "option",
                 "hint", "required", "example", "per_engine", "absolute", "shown")

    def __init__(self, section: str, name: str, type: str, default: Any, help: str, *, unit: str = "",
                 low: float | None = None, high: float | None = None, choices: tuple[str, ...] = (),
                 env: str | None = None, option: str | None = None, hint: str | None = None,
                 required: bool = False, example: str | None = None, per_engine: bool = False,
                 absolute: bool = False, shown: str | None = None):
        self.section, self.name, self.type, self.default, self.help = section, name, type, default, help
        self.unit, self.low, self.high, self.choices = unit, low, high, choices
        self.env, self.option, self.hint, self.required = env, option, hint, required
        self.example = example  # the TOML value `config example` writes (None: not in the example)
        self.per_engine = per_engine  # engines only: [defaults] may not set it
        self.absolute = absolute  # paths: must start with /
        self.shown = shown  # the default as the reference states it, where the value is computed

    def __repr__(self) -> str:
        return f"Key({self.section or 'top'}.{self.name})"


K = Key
_DUR = "a number of seconds or a duration such as \"90s\", \"15m\", \"2h\""

KEYS: tuple[Key, ...] = (
    # --- the command line and the environment ------------------------------------------------------------
    K("global", "config", "path", "/etc/gpuwarden/node.toml", "The node config (TOML) every command reads.",
      env="GPUWARDEN_CONFIG", option="--config"),
    K("global", "backend", "choice", "auto", "GPU backend; auto: the first of amdsmi, sysfs, nvml that works "
      "(the simulated node only when named).", choices=BACKENDS + ("auto",), env="GPUWARDEN_BACKEND",
      option="--backend"),
    K("global", "sysfs_root", "path", "/sys", "Read this tree instead of /sys (a captured node).",
      env="GPUWARDEN_SYSFS_ROOT", option="--sysfs-root"),
    K("global", "proc_root", "path", "/proc", "Read this tree instead of /proc (a captured node).",
      env="GPUWARDEN_PROC_ROOT", option="--proc-root"),
    K("global", "read_timeout", "seconds", 3.0, "How long one read of a GPU source may take before that GPU is "
      "shown as STALE.", unit="s", low=0.05, high=600, env="GPUWARDEN_READ_TIMEOUT", option="--read-timeout",
      hint="e.g. --read-timeout 3 (the default; GPUWARDEN_READ_TIMEOUT=3 in the environment)"),
    K("global", "host_root", "path", None, "The live host's / mounted here (a DaemonSet's /host): its /sys and "
      "/proc are read there.", env="GPUWARDEN_HOST_ROOT"),
    K("global", "dev_root", "path", "/dev", "Device files (/dev/kfd, /dev/dri) of a captured node.",
      env="GPUWARDEN_DEV_ROOT"),
    K("global", "etc_root", "path", "/etc", "Host files doctor reads (limits.conf ...) of a captured node.",
      env="GPUWARDEN_ETC_ROOT"),
    K("global", "boot_root", "path", "/boot", "The kernel config doctor reads, of a captured node.",
      env="GPUWARDEN_BOOT_ROOT"),
    K("global", "opt_root", "path", "/opt", "ROCm's version file doctor reads, of a captured node.",
      env="GPUWARDEN_OPT_ROOT"),
    # --- node.toml, top level --------------------------------------------------------------------------------
    K("", "state_dir", "path", None, "Where gpuwarden keeps engine state, logs and the registration gate.",
      env="GPUWARDEN_STATE_DIR", option="--state-dir", absolute=True, example='"/run/gpuwarden"',
      hint='e.g. state_dir = "/run/gpuwarden"',
      shown="/run/gpuwarden as root, else $XDG_RUNTIME_DIR/gpuwarden (/tmp/gpuwarden-UID without it)"),
    # --- [arena] -------------------------------------------------------------------------------------------
    K("arena", "path", "path", None, "MAP_SHARED file every engine maps and registers.", required=True,
      absolute=True, example='"/dev/shm/experts.arena"', hint='e.g. path = "/dev/shm/experts.arena"'),
    K("arena", "size", "size", None, "Payload size; launch refuses an arena of another size.", unit="bytes",
      low=1, high=1 << 50, example='"64GiB"', hint='write e.g. size = "64GiB"'),
    K("arena", "source", "path", None, "What `gpuwarden arena create` fills it from.",
      example='"/models/experts.bin"', hint='e.g. source = "/models/experts.bin"'),
    # --- [stagger] -----------------------------------------------------------------------------------------
    K("stagger", "slots", "int", 1, "At most this many engines register at once (launch --stagger K).",
      low=1, high=1024, example="1", hint="slots = 1 lets one engine register at a time"),
    K("stagger", "registration_timeout", "seconds", 600.0, "Seconds an engine may take to register before its "
      "slot is freed.", unit="s", low=0, high=MAX_SECONDS, example="600"),
    # --- [[engines]] and [defaults] ---------------------------------------------------------------------
    K("engines", "name", "name", None, "The engine's name: letters, digits, '.', '_' or '-'.", required=True,
      per_engine=True, hint='e.g. name = "dp0"'),
    K("engines", "argv", "argv", None, "The command line the shim runs (argv[0] is the program).", required=True,
      hint='e.g. argv = ["python", "-m", "myengine", "--port", "8000"]'),
    K("engines", "gpu", "gpu", None, "The one GPU the engine sees (the shim sets ROCR/HIP/CUDA_VISIBLE_DEVICES); "
      "unset: every GPU.", low=0, high=MAX_GPU_INDEX, per_engine=True, hint="e.g. gpu = 0"),
    K("engines", "env", "env", {}, "Variables added to the engine's environment.",
      example='{ NCCL_DEBUG = "WARN" }', hint='e.g. env = { NCCL_DEBUG = "INFO" }'),
    K("engines", "workdir", "path", None, "The engine's working directory.", example='"/srv/engine"',
      hint='e.g. workdir = "/srv/engine"'),
    K("engines", "progress", "choice", "status", "How gpuwarden follows its start: status (the engine speaks the "
      "status protocol), log (registered_pattern), preload (gpuwarden interposes its hipHostRegister).",
      choices=("status", "log", "preload"), example='"preload"',
      hint='"status": the engine speaks the status protocol; "log": set registered_pattern; '
           '"preload": gpuwarden interposes its register calls'),
    K("engines", "registered_pattern", "regex", None, "With progress = \"log\": a line the engine prints once "
      "registered.", hint='e.g. registered_pattern = "session is up"'),
    K("engines", "ready_pattern", "regex", None, "A line the engine prints once it serves.",
      example='"serving on port \\\\d+"', hint='e.g. ready_pattern = "session is up"'),
    K("engines", "stop_signal", "signal", "SIGTERM", "The signal that asks the engine to stop.",
      example='"SIGINT"', hint='e.g. stop_signal = "SIGINT"'),
    K("engines", "stop_grace", "seconds", 30.0, "Seconds between the stop signal and SIGKILL.", unit="s", low=0,
      high=MAX_SECONDS, example="60"),
    K("engines", "restart", "choice", "no", "on-failure: restart after a crash, with backoff and a start limit.",
      choices=("no", "on-failure"), example='"on-failure"',
      hint='restart = "on-failure" restarts after a crash, with backoff and a start limit'),
    K("engines", "restart_backoff", "seconds", 1.0, "First wait before a restart; doubled each time.", unit="s",
      low=0, high=MAX_SECONDS, example="5"),
    K("engines", "restart_backoff_max", "seconds", 60.0, "The longest wait before a restart.", unit="s", low=0,
      high=MAX_SECONDS, example="120"),
    K("engines", "start_limit_burst", "int", 5, "Give up after this many starts within start_limit_interval.",
      low=1, high=1000, example="3", hint="e.g. start_limit_burst = 5"),
    K("engines", "start_limit_interval", "seconds", 300.0, "The window start_limit_burst counts starts in.",
      unit="s", low=0, high=MAX_SECONDS, example="600"),
    K("engines", "log_max", "size", 16 << 20, "engine.log and engine.log.1 stay under this.", unit="bytes",
      low=4096, high=1 << 40, example='"256MiB"', hint='e.g. log_max = "64MiB"'),
    K("engines", "gated", "bool", True, "Take part in the registration gate ([stagger]).",
      hint="e.g. gated = false"),
    K("engines", "gate_release", "gate_release", "registered", "When the gate slot goes: \"registered\", "
      "\"ready\" (needs ready_pattern) or \"<N>s\" after registered (preload and log engines).",
      example='"ready"', hint='gate_release = "ready" holds the slot until ready_pattern appears'),
    K("engines", "register_threshold", "size", 256 << 20, "preload: smaller registrations pass straight through.",
      unit="bytes", low=0, high=1 << 50, example='"256MiB"',
      hint='e.g. register_threshold = "256MiB" (registrations below it pass ungated)'),
    K("engines", "pinned_headroom", "size", None, "Pinned host memory the engine allocates besides the arena "
      "(KFD charges it against the same limit); unset: the budget's stated default.", unit="bytes", low=0,
      high=1 << 50, hint='e.g. pinned_headroom = "6GiB" (pinned host memory the engine allocates besides the '
                         'arena)'),
    # --- [agent] -------------------------------------------------------------------------------------------
    K("agent", "interval", "duration", 1.0, "Seconds between refreshes.", unit="s", low=MIN_REFRESH_S,
      hint='e.g. interval = "2s"'),
    K("agent", "deep_scan_interval", "duration", 30.0, "Seconds between scans of new processes' /proc/<pid>/fd "
      "for device holders.", unit="s", low=1.0, hint='e.g. deep_scan_interval = "10m"'),
    K("agent", "full_scan_interval", "duration", 300.0, "Seconds between scans of every process's /proc/<pid>/fd.",
      unit="s", low=1.0, hint='e.g. full_scan_interval = "10m"'),
    K("agent", "socket_group", "str", None, "Group that may use the API socket (mode 0660); unset: only the "
      "agent's user.", hint='e.g. socket_group = "gpuops"'),
    K("agent", "kmsg", "str", "auto", "Kernel log source: auto (/dev/kmsg, else journalctl -k -f), off, or a "
      "file or FIFO of kernel log lines.", hint='e.g. kmsg = "off"'),
    K("agent", "events_max", "size", 16 << 20, "Bytes of event log before it rotates (one older file is kept).",
      unit="bytes", low=64 << 10, hint='e.g. events_max = "16MiB"'),
    K("agent", "bundle_on", "choices", (), "Incidents that take a bundle.", choices=("residual", "crash",
      "kernel-fault"), hint='e.g. bundle_on = ["crash", "kernel-fault"]'),
    K("agent", "bundle_min_interval", "duration", 1800.0, "At most one policy bundle this often.", unit="s",
      low=0.0, hint='e.g. bundle_min_interval = "10m"'),
    K("agent", "purge_dead_holders", "bool", False, "Purge the VRAM of holders that died.",
      hint="e.g. purge_dead_holders = true"),
    K("agent", "drain_on_residual_after", "duration", None, "Seconds a residual must last before its GPU is "
      "drained; unset: never.", unit="s", low=1.0, hint='e.g. drain_on_residual_after = "10m"'),
    # --- [kubernetes] --------------------------------------------------------------------------------------
    K("kubernetes", "policy", "choice", "taint", "How the agent tells the API server about a bad GPU.",
      choices=("taint", "condition", "off"),
      hint='"taint": condition and taint; "condition": the condition only; "off": neither'),
    K("kubernetes", "taint_after", "duration", 120.0, "Seconds residual must last before the taint.", unit="s",
      hint='e.g. taint_after = "2m" (or "90s", or 120)'),
    K("kubernetes", "clear_after", "duration", 10.0, "Seconds clean before the taint goes (unless a purge or "
      "reset verified it).", unit="s", hint='e.g. clear_after = "2m" (or "90s", or 120)'),
    K("kubernetes", "node_name", "str", None, "This node's name; unset: NODE_NAME, else the host name.",
      hint='e.g. node_name = "..."'),
    K("kubernetes", "pod_resources_socket", "str", "/var/lib/kubelet/pod-resources/kubelet.sock",
      "The kubelet's pod-resources API.", hint='e.g. pod_resources_socket = "..."'),
    K("kubernetes", "health", "bool", False, "Serve AMD's per-GPU device-plugin health service (opt-in).",
      hint="health = true serves AMD's device-plugin health socket"),
    K("kubernetes", "health_socket", "str",
      "/var/lib/amd-metrics-exporter/amdgpu_device_metrics_exporter_grpc.socket",
      "Where the health service listens.", hint='e.g. health_socket = "..."'),
    K("kubernetes", "kubeconfig", "str", None, "A kubeconfig; unset: the pod's service account.",
      hint='e.g. kubeconfig = "..."'),
    K("kubernetes", "remediate", "bool", False, "Let the agent cordon, evict, fix and uncordon the node.",
      hint="remediate = true lets the agent cordon, evict, fix and uncordon the node (off by default)"),
    K("kubernetes", "remediate_after", "duration", 600.0, "Seconds a GPU's trouble must last before remediation "
      "starts.", unit="s", hint='e.g. remediate_after = "2m" (or "90s", or 120)'),
    K("kubernetes", "remediation_slots", "int", 1, "Nodes of the cluster remediating at once (Leases in "
      "lease_namespace).", low=1, hint="remediation_slots = 1: one node of the cluster remediates at a time"),
    K("kubernetes", "remediation_interval", "duration", 3600.0, "At most one remediation of this node per "
      "interval.", unit="s", hint='e.g. remediation_interval = "2m" (or "90s", or 120)'),
    K("kubernetes", "eviction_timeout", "duration", 300.0, "How long PodDisruptionBudget refusals and terminating "
      "pods are waited for.", unit="s", hint='e.g. eviction_timeout = "2m" (or "90s", or 120)'),
    K("kubernetes", "lease_namespace", "str", "gpuwarden", "Namespace of the remediation Leases.",
      hint='e.g. lease_namespace = "..."'),
    K("kubernetes", "exclusion", "choice", "auto", "How one dirty GPU is kept from new tenants: auto "
      "(DeviceTaintRules where served, else the node taint), dra, node.", choices=("auto", "dra", "node"),
      hint='e.g. exclusion = "auto"'),
    K("kubernetes", "dra_drivers", "names", ("gpu.amd.com", "gpu.nvidia.com"), "DRA drivers whose "
      "ResourceSlices name this node's GPUs.", hint='e.g. dra_drivers = ["gpu.amd.com"]'),
    K("kubernetes", "device_taint_effect", "choice", "NoSchedule", "NoExecute (opt-in) also evicts the pods "
      "that hold the device.", choices=("NoSchedule", "NoExecute"), hint='e.g. device_taint_effect = "NoSchedule"'),
    K("kubernetes", "post_clean", "bool", True, "A pod that held GPUs left: check, clean, verify.",
      hint="post_clean = true or false"),
    K("kubernetes", "post_clean_grace", "duration", 5.0, "Seconds after the pod left before the check.",
      unit="s", hint='e.g. post_clean_grace = "5s"'),
    K("kubernetes", "post_clean_reset", "bool", False, "A reset only where every GPU it reaches is free.",
      hint="post_clean_reset = true or false"),
    K("kubernetes", "gate_listen", "text", "", "Where the gpu-check init container asks the agent; \"\" serves "
      "nothing.", hint='e.g. gate_listen = "0.0.0.0:9836" ("" serves nothing)'),
    K("kubernetes", "gate_audience", "str", "gpuwarden", "The token audience the gate accepts.",
      hint='e.g. gate_audience = "..."'),
    K("kubernetes", "health_upstream", "str", None, "Device-plugin clusters: AMD's metrics exporter's own socket, "
      "whose verdict the health service merges.", hint='e.g. health_upstream = "..."'),
)

_BY_SECTION: dict[str, dict[str, Key]] = {s: {} for s in SECTIONS}
for _k in KEYS:
    _BY_SECTION[_k.section][_k.name] = _k


def section(name: str) -> dict[str, Key]:
    """The keys of one section by name, in table order."""
    return _BY_SECTION[name]


def key(section_name: str, name: str) -> Key:
    return _BY_SECTION[section_name][name]


def default(section_name: str, name: str) -> Any:
    """A key's default, for the dataclasses that carry a section's values (one source for both)."""
    return _BY_SECTION[section_name][name].default


def path_problem(k: Key, value: object) -> str | None:
    """What is wrong with `value` as the path key `k` (None: nothing); the loader's cheap state_dir check and
    the schema's path type share it."""
    if not isinstance(value, str) or not value:
        return f"must be a path string, got {value!r}"
    if "\0" in value or "\n" in value:
        return "a path cannot hold a NUL or a newline"
    if k.absolute and not value.startswith("/"):
        return f"must be an absolute path, got {value!r}"
    return None
