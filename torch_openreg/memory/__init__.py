"""Memory policy for openreg: the caching device allocator and the pinned-host cache."""

from .caching_allocator import DeviceCachingAllocator, allocator, format_size, owner
from .host_allocator import host_allocator

__all__ = ["DeviceCachingAllocator", "allocator", "format_size", "host_allocator", "owner"]
