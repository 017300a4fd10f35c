// The floating-point environment inside qkv: the default one (round to nearest, every
// exception masked, no flag raised), whatever the caller's.
//
// The kernels raise IEEE exception flags on ordinary inputs (the SIMD kernels' vector exp and
// their handling of masked -inf scores raise "invalid" or "overflow", and "inexact" is raised
// everywhere), which is harmless while the exceptions are masked. A caller that unmasked one
// (feenableexcept(FE_INVALID): C and Fortran programs do) died of SIGFPE inside qkv, and a
// caller that tests the flags after a call found qkv's. So each public entry point runs under FloatingPointScope: it saves the
// calling thread's environment, installs the default one, and puts the caller's back (its
// flags and traps as they were) on the way out, however it leaves. The team's worker threads
// install the default environment once, when they start (they inherit the creating thread's).
// Results do not depend on the caller's rounding mode either.
#pragma once

#include <cfenv>

namespace qkv::core {

class FloatingPointScope {
 public:
  FloatingPointScope() noexcept {
    std::fegetenv(&saved_);
    std::fesetenv(FE_DFL_ENV);
  }
  ~FloatingPointScope() { std::fesetenv(&saved_); }
  FloatingPointScope(const FloatingPointScope&) = delete;
  FloatingPointScope& operator=(const FloatingPointScope&) = delete;

 private:
  std::fenv_t saved_;
};

// For a thread qkv starts: the default environment from here on.
inline void use_default_floating_point() noexcept { std::fesetenv(FE_DFL_ENV); }

}  // namespace qkv::core
