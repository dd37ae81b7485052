// Linked into every binary and test of --config=asan (.bazelrc, through
// --custom_malloc: it defines no allocator, so glibc's malloc, intercepted by
// AddressSanitizer, stays). LeakSanitizer reads its suppressions from here
// because a suppressions file would need an absolute path in .bazelrc.
//
// Only leaks inside the Debian libraries we link, never in our code; each
// names where.

extern "C" __attribute__((visibility("default"))) const char* __lsan_default_suppressions() {
  return
      // Gloo 0.0~git20220518 (libgloo0), gloo/transport/tcp/device.cc:
      // lookupAddrForHostname (inlined into CreateDeviceAttr) throws with
      // GLOO_ENFORCE when bind(2) fails, before its freeaddrinfo, so an
      // interface address this host does not own leaks one getaddrinfo
      // result (worker/comm:gloo_backend_test, InvalidArgumentsNameTheField).
      "leak:gloo::transport::tcp::CreateDeviceAttr\n";
}
