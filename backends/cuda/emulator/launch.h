// What build.py's generated launch thunks use: unpacking cuLaunchKernel-style arguments
// (args[i] points to the i-th parameter's value) and describing a kernel's parameters.
#pragma once

#include <stddef.h>

#include <string>
#include <type_traits>
#include <utility>

extern "C" int emu_run(const char* kernel, void (*body)(void**), void** args, unsigned gx, unsigned gy, unsigned gz,
                       unsigned bx, unsigned by, unsigned bz, int order, unsigned long long seed);

namespace cuda_emu {

template <class... P, size_t... I>
inline void call_unpacked(void (*kernel)(P...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_cv_t<std::remove_reference_t<P>>*>(args[I])...);
}

// Calls kernel(*(P0*)args[0], *(P1*)args[1], ...).
template <class... P>
inline void call_with_args(void (*kernel)(P...), void** args) {
    call_unpacked(kernel, args, std::index_sequence_for<P...>{});
}

// One parameter as "<kind><bytes>": p pointer, f floating point, i signed and u unsigned
// integer, o anything else (a struct passed by value).
template <class P>
inline std::string describe_param() {
    using T = std::remove_cv_t<std::remove_reference_t<P>>;
    const char kind = std::is_pointer<T>::value             ? 'p'
                      : std::is_floating_point<T>::value    ? 'f'
                      : std::is_integral<T>::value && std::is_signed<T>::value ? 'i'
                      : std::is_integral<T>::value          ? 'u'
                                                            : 'o';
    return std::string(1, kind) + std::to_string(sizeof(T));
}

// The kernel's parameters, comma-separated: "p8,i4,f4".
template <class... P>
inline std::string describe_params(void (*)(P...)) {
    std::string out;
    ((out += (out.empty() ? "" : ",") + describe_param<P>()), ...);
    return out;
}

}  // namespace cuda_emu
