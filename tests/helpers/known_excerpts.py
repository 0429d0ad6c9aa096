"""The known-issues catalog's entries and the real log excerpts (under tests/) each one was written from, shared by
the unit tests that match them and the integration tests that run `triage` and `known` on them.
"""

# entry id -> the real excerpt (under tests/) it must match
CASES = {
    "kfd-evict-restore-userptr-benign": "triage_corpus/c34_rocm343_desc_evict_restore_userptr_minus14_benign.log",
    "kfd-sdma-oversubscription": "fixtures/dmesg/rocm343_comment3_kfd_evicting_pasid_sdma_oversubscription.log",
    "kfd-userptr-map-failed-ppc64": "triage_corpus/c53_amdgpu147_no_stamps_gpuvm_map_failed_userptr_minus1_fault.log",
    "amdgpu-vm-stats-nonzero-after-oom":
        "fixtures/dmesg/rocm5844_gfx1152_oom_kill_llama_server_vm_stats_nonzero_not_enough_memory_cs.log",
    "amdgpu-pin-bo-gart-exhausted": "triage_corpus/c41_sdnext913_pin_bo_map_wptr_gart_then_hip_segfault.log",
    "hip-no-binary-for-gpu": "fixtures/known/nixsd7_hip_no_binary_for_gpu_aborted.txt",
    "hip-invalid-device-function-vllm": "fixtures/known/rocm4386_vllm_docker_7900xt_hip_invalid_device_function.txt",
    "hip-segfault-unsupported-gpu": "fixtures/dmesg/rocm4189_rx570_segfault_libamdhip64.log",
    "hip-segfault-fatbinary-adddevprogram":
        "triage_corpus/c40_sdnext2252_ctime_three_python_segfaults_libamdhip64_same_offset.log",
    "hsa-runtime-segfault": "triage_corpus/c39_therock3081_segfault_libhsa_runtime_new_mapping.log",
    "hsa-memory-access-fault-page-not-present": "fixtures/dmesg/app_stderr_rocm5225_hsa_memory_access_fault_by_gpu_node.txt",
    "hsa-memory-access-fault-read-only-mi300x": "fixtures/known/rocm4021_mi300x_hsa_write_to_read_only_page_tqdm.txt",
    "gfx1151-gfxhub-fault-mes-suspend": "fixtures/dmesg/rocm5745_gfx1151_gfxhub_pagefault_mes_sq_intr_gpu_reset_mode2.log",
    "amdgpu-gfxhub-fault-rdna3-tcp": "fixtures/known/rocmlibs1132_gfx1151_llama_bench_gfxhub_fault_tcp.log",
    "amdgpu-gfxhub-fault-sdma-rocm-bandwidth-test":
        "triage_corpus/c55_rocm2205_gfxhub_fault_inline_truncated_comm_trailing_spaces.log",
    "amdgpu-gfxhub-no-retry-fault-pytorch": "triage_corpus/c50_amdgpu172_gfxhub0_no_retry_for_process_own_line.log",
    "amdgpu-mmhub-fault-vmc": "triage_corpus/c51_amdgpu150_mmhub0_no_retry_inline_process_vmc.log",
    "mi50-ollama-gfxhub-fault-address-zero": "triage_corpus/c52_ollama12915_ctime_orphan_detail_then_gfxhub0_fault.log",
    "amdgpu-pasid0-fault-cpc": "fixtures/dmesg/rocm4557_gfx1103_780m_pagefault_pasid0_cpc_mes_unmap_failed_mode2.log",
    "mes-firmware-0x83-strix-halo": "triage_corpus/c47_rocm5724_strix_mes_remove_queue_evict_suspend_reset.log",
    "gfx1103-mes-remove-queue-cwsr":
        "fixtures/dmesg/rocm4557_gfx1103_780m_mes_remove_queue_failed_quiesce_kfd_double_mode2_reset.log",
    "rdna3-mes-failed-to-response-old-rocm": "fixtures/known/tinygrad7900xtx12_rocm603_mes_failed_to_response_msg14.log",
    "gfx1152-mes-wait-reg-mem-ring-full": "fixtures/dmesg/rocm5844_gfx1152_mes_wait_reg_mem_ring_full_hung_task.log",
    "sdma0-ring-timeout-mes-rx7900": "fixtures/dmesg/rocm2533_rx7900xt_syslog_ring_sdma0_timeout_mes_failed_gpu_reset.log",
    "bc250-unsupported-apu-compute-hang":
        "fixtures/dmesg/rocm6313_bc250_gfx1013_journal_sdma0_ring_timeout_qcm_fence_kfd_restore_failed_mode1.log",
    "raven-qcm-fence-quiesce-kfd": "fixtures/dmesg/rocm1584_raven_syslog_qcm_fence_timeout_quiesce_kfd_gpu_reset_mode2.log",
    "gpu-recovery-disabled-7840u": "fixtures/dmesg/rocm3207_7840u_mes_remove_queue_gpu_recovery_disabled_reset25.log",
    "gfx12-ring-timeout-ring-reset-failed": "triage_corpus/c01_amdgpu202_gfx12_ring_timeout_new_process_wording.log",
    "kworker-hung-amdgpu-tlb-fence": "triage_corpus/c24_rocm5536_hung_kworker_amdgpu_tlb_fence_work.log",
    "navi10-reset-kiq-vram-lost": "triage_corpus/c46_vendorreset3_reset_kiq_test_failed_vram_lost.log",
    "psp-resume-failed-reset-failed": "fixtures/known/rocm2804_psp_create_ring_failed_on_resume_gpu_reset_failed.log",
    "mi210-psp-ring-failed-xgmi-bridge": "triage_corpus/c11_rocm2747_ctime_psp_create_ring_failed_mi210.log",
    "amdgpu-probe-enomem-bar": "triage_corpus/c61_rocm6281_mi210_fatal_init_probe_failed_minus12.log",
    "psp-toc-firmware-missing": "triage_corpus/c12_kernelci2238_direct_firmware_load_psp_toc_missing.log",
    "mi50-athub-uncorrectable-ras": "fixtures/dmesg/rocm1886_mi50_ras_athub_uncorrectable_gpu_reset_smu_failures.log",
    "gmc-v8-null-deref-set-pte": "triage_corpus/c36_rocm365_oops_null_deref_gmc_v8_set_pte_pde.log",
    "nvidia-gsp-rpc-timeout-xid119": "triage_corpus/c32_ogkm446_ctime_xid119_gsp_rpc_timeout_nvidia_smi.log",
    "nvidia-gsp-heartbeat-timeout-open595": "triage_corpus/c33_ogkm1230_gsp_heartbeat_timeout_without_xid.log",
    "nvidia-fallen-off-bus": "fixtures/dmesg/nvidia_gpu_fallen_off_bus_no_xid_570.log",
    "nvidia-xid31-mmu-fault": "fixtures/dmesg/nvidia_xid31_mmu_fault_rtx5070ti_open595.log",
    "nvidia-xid45-after-nvlink-xid": "triage_corpus/c27_ogkm1150_bare_kernel_xid45_caused_by_previous_xid.log",
    "nvidia-xid94-contained-ecc": "triage_corpus/c29_akash244_ctime_xid43_xid31_then_xid94_ecc.log",
    "vllm-nccl-watchdog-timeout": "fixtures/known/vllm6042_nccl_watchdog_allreduce_timeout_worker_died.txt",
    "vllm-cuda-illegal-memory-access": "fixtures/known/vllm1214_cuda_illegal_memory_access_sampler.txt",
}
