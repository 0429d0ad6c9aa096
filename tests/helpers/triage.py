"""What several test files share with test_triage.py: EXPECTED.

Taken out of test_triage.py so that no test module imports another (tests/README.md)."""

from __future__ import annotations


# fixture -> rule ids that must be found (each a real event in that log)
EXPECTED = {
    "app_stderr_rocm5225_hsa_memory_access_fault_by_gpu_node.txt": {"hsa.memory_access_fault", "app.core_dumped"},
    "nvidia_ctime_xid13_xid109_sm_warp_exception_ctx_switch_timeout.log": {"nvidia.xid", "nvidia.peermem"},
    "nvidia_gpu_fallen_off_bus_no_xid_570.log": {"nvidia.fallen_off_bus", "nvidia.probe_failed"},
    "nvidia_xid31_13_32_gtx_dxvk.log": {"nvidia.xid"},
    "nvidia_xid31_mmu_fault_rtx5070ti_open595.log": {"nvidia.xid"},
    "oom_killer_dmesg_time_format_iso_perl.log": {"oom.kill", "oom.invoked", "oom.reaped"},
    "rocm1584_raven_syslog_qcm_fence_timeout_quiesce_kfd_gpu_reset_mode2.log": {
        "amdgpu.qcm_fence_timeout", "amdgpu.cp_unrecoverable", "kfd.evict_failed", "kfd.quiesce_failed",
        "amdgpu.reset_begin", "amdgpu.reset_method", "amdgpu.reset_resuming"},
    "rocm1886_mi50_ras_athub_uncorrectable_gpu_reset_smu_failures.log": {
        "ras.uncorrectable_event", "ras.ecc_active", "amdgpu.reset_begin", "amdgpu.smu_msg_failed",
        "amdgpu.powerplay_failed", "ras.ip_lost"},
    "rocm2533_rx7900xt_syslog_ring_sdma0_timeout_mes_failed_gpu_reset.log": {
        "amdgpu.ring_timeout", "amdgpu.reset_begin", "mes.no_response", "mes.remove_queue_failed",
        "mes.unrecoverable", "kfd.evict_failed"},
    "rocm3207_7840u_mes_remove_queue_gpu_recovery_disabled_reset25.log": {
        "amdgpu.reset_succeeded", "mes.no_response", "mes.remove_queue_failed", "kfd.evict_failed",
        "amdgpu.recovery_disabled", "kfd.restore_failed", "amdgpu.reset_begin", "kernel.workqueue_hog",
        "mes.misc_failed", "amdgpu.reset_method"},
    "rocm343_comment3_kfd_evicting_pasid_sdma_oversubscription.log": {
        "kfd.sdma_oversubscription", "kfd.evict_pasid", "kfd.restore_pasid"},
    "rocm4189_rx570_segfault_libamdhip64.log": {"userspace.crash"},
    # doctor's module-options inputs (tests/unit/ops/doctor/test_doctor_knobs.py): kernel lines no triage rule is about
    "rocm5671_debian_command_line_amdgpu_ttm_options.log": set(),
    "tunaos103_amdgpu_unknown_parameter_si_cik_support_ignored.log": set(),
    "rocm4557_gfx1103_780m_mes_remove_queue_failed_quiesce_kfd_double_mode2_reset.log": {
        "mes.no_response", "mes.remove_queue_failed", "kfd.evict_failed", "kfd.quiesce_failed",
        "amdgpu.reset_begin", "mes.misc_failed", "amdgpu.reset_method", "amdgpu.reset_succeeded"},
    "rocm4557_gfx1103_780m_pagefault_pasid0_cpc_mes_unmap_failed_mode2.log": {
        "mes.no_response", "amdgpu.page_fault", "amdgpu.reset_method", "amdgpu.reset_resuming"},
    "rocm5225_680m_gfxhub_pagefault_in_process_variant_utcl2.log": {"amdgpu.page_fault"},
    "rocm5616_gfx1103_darktable_gfxhub_pagefault_mes_gpu_reset_queue_evicted.log": {
        "amdgpu.page_fault", "mes.no_response", "amdgpu.reset_begin", "amdgpu.sq_intr", "amdgpu.reset_method",
        "amdgpu.reset_succeeded", "amdgpu.wedged", "kfd.queue_evicted", "amdgpu.devcoredump"},
    "rocm5745_gfx1151_gfxhub_pagefault_mes_sq_intr_gpu_reset_mode2.log": {
        "amdgpu.page_fault", "mes.no_response", "amdgpu.sq_intr", "amdgpu.reset_begin", "amdgpu.vpe_reset_failed",
        "amdgpu.reset_method", "amdgpu.reset_succeeded", "amdgpu.wedged", "amdgpu.ring_test_failed"},
    "rocm5844_gfx1152_mes_wait_reg_mem_ring_full_hung_task.log": {
        "mes.no_response", "mes.misc_failed", "mes.ring_full", "kernel.hung_task_state"},
    "rocm5844_gfx1152_oom_kill_llama_server_vm_stats_nonzero_not_enough_memory_cs.log": {
        "oom.kill", "oom.reaped", "amdgpu.vm_stats_leak", "amdgpu.cs_no_memory", "unclassified"},
    "rocm6313_bc250_gfx1013_journal_sdma0_ring_timeout_qcm_fence_kfd_restore_failed_mode1.log": {
        "amdgpu.ring_timeout", "amdgpu.ring_reset", "amdgpu.qcm_fence_timeout", "kfd.suspend_failed",
        "kiq.fence_timeout", "amdgpu.ring_test_failed", "kfd.restore_failed", "amdgpu.reset_begin",
        "amdgpu.reset_method", "amdgpu.vram_lost", "amdgpu.vm_flush_timeout", "amdgpu.devcoredump"},
    "rocm6313_bc250_gfx1013_journal_sdma0_timeout_kiq_fence_gpuvm_map_failed.log": {
        "kiq.fence_timeout", "amdgpu.ring_timeout", "amdgpu.qcm_fence_timeout", "kfd.suspend_failed",
        "kfd.gpuvm_map_failed"},
}
