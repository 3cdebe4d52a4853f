"""Memory figures for DeepSpeed's accounting (`memory_allocated`, `max_memory_allocated`, ...).

TPU: the device allocator's own figures. PJRT CPU keeps no allocator statistics and its buffers
live in host memory, so the figures are this process's resident set and the host's memory, as
DeepSpeed's CPU accelerator reports them. All figures are bytes.
"""

import psutil

from .backend import runtime


class MemoryAccounting:
    """Usage, limit and a resettable peak of one process's device, as torch.cuda keeps them."""

    def __init__(self):
        self._peak_bytes = 0  # highest usage observed since start or the last reset
        self._peak_was_reset = False

    def usage(self, device):
        """(bytes in use, the allocator's peak or None, bytes limit) of torch.device `device`; every
        reading raises the tracked peak, so a peak read afterwards is never below a usage reported."""
        info = runtime.memory_info(device)
        if info is not None:
            used, device_peak, limit = info["bytes_used"], info.get("peak_bytes_used"), info["bytes_limit"]
        else:
            used, device_peak, limit = psutil.Process().memory_info().rss, None, psutil.virtual_memory().total
        self._peak_bytes = max(self._peak_bytes, used)
        return used, device_peak, limit

    def peak(self, device):
        """The highest usage since process start or the last `reset_peak`."""
        _, device_peak, _ = self.usage(device)
        if device_peak is not None and not self._peak_was_reset:
            self._peak_bytes = max(self._peak_bytes, device_peak)  # the allocator's peak counts from process start
        return self._peak_bytes

    def reset_peak(self, device):
        """Start the peak over from the current usage."""
        self._peak_was_reset = True
        self._peak_bytes = self.usage(device)[0]

    def available(self, device):
        """Bytes the device can still allocate (PJRT CPU: the host's available memory)."""
        info = runtime.memory_info(device)
        if info is not None:
            return info["bytes_limit"] - info["bytes_used"]
        return psutil.virtual_memory().available

    def stats(self, device):
        """torch.cuda.memory_stats()'s keys that DeepSpeed reads, and `bytes_limit`."""
        used, _, limit = self.usage(device)
        peak = self.peak(device)
        return {
            "allocated_bytes.all.current": used,
            "allocated_bytes.all.peak": peak,
            "reserved_bytes.all.current": used,
            "reserved_bytes.all.peak": peak,
            "bytes_limit": limit,
        }
