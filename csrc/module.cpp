// module.cpp — the Python module `paged_attention_ext._C`. Importing it loads this shared library,
// which runs the static TORCH_LIBRARY registrations (ops.cpp, cpu/bindings_cpu.cpp, cuda/). Its
// Python functions only convert what the owners of each fact report:
//   cpu_kernel() -> str                              the variant the next CPU call runs
//   cpu_kernel_variants() -> [(name, runnable, note)]   every variant of this build, best first here
//   cpu_threading() -> dict                          how many threads a CPU call wakes
//     idle_threads           "spin" or "sleep": what idle OpenMP threads do between regions
//     setting                the environment variable that decided it, or "default"
//     min_kv_bytes_per_thread  a call wakes one thread per this many bytes of K / V it reads
//     forced                 PAGED_ATTN_CPU_KV_BYTES_PER_THREAD set that minimum
//                          (ValueError: it is not a positive integer)
//   build_info() -> dict                             what this build compiled and registered:
//     torch_version        str, the torch the library was compiled against (torch's headers)
//     cpu_kernel_variants  [name], the build's table order (cpu/kernel_variants.cpp)
//     cpu_kernel_scopes    {name: the calls it computes itself}, for the variants that hand
//                          other calls to another variant's code (KernelVariant::scope)
//     compiler             str, the C++ compiler of the host code ("gcc 12.2.0", "clang 14.0.6")
//     openmp               bool, the C++ code was compiled with OpenMP (_OPENMP, set by the
//                          build when the compiler has it): without it at::parallel_for runs every
//                          CPU kernel call on one thread
//     registered_kernels   {dispatch key: [op overload]} (torch_glue/registered_kernels.h)
//     cuda                 bool, CUDA kernels compiled (PAGED_ATTN_WITH_CUDA, set by the build)
//     cuda_archs           [image] ("sm_80", "compute_120"; cuda/build_info.h), [] without CUDA
//     cuda_attention_pairs [(query dtype, kv_cache_dtype)] (cuda/dispatch.cuh), [] without CUDA
//     cuda_head_sizes      [int] (cuda/dispatch.cuh), [] without CUDA
//     cuda_runtime_version int (CUDART_VERSION), 0 without CUDA
//     cuda_attention_kernel str, which CUDA attention kernel runs: PAGED_ATTN_CUDA_KERNEL or the
//                          rule (cuda/kernel_choice.h), "" without CUDA
//     cuda_split           str, how the CUDA v1 / decode split aims: PAGED_ATTN_CUDA_SPLIT or the
//                          default (cuda/kernel_choice.h), "" without CUDA
//     cuda_pdl             str, whether a split's reduce kernel is launched with programmatic
//                          dependent launch: PAGED_ATTN_CUDA_PDL (cuda/kernel_choice.h), ""
//                          without CUDA
//     cuda_baseline_kernel str, which archs' code holds the baseline kernel (cuda/
//                          kernel_families.h): "every arch" (built with PAGED_ATTN_CUDA_BASELINE=1)
//                          or "below sm_80 only", "" without CUDA
//   cuda_attention_launches([reload]) -> {"baseline": n, "pipelined": n, "mma": n}
//                          attention launches per CUDA kernel so far ({} without CUDA); a true
//                          `reload` first reads PAGED_ATTN_CUDA_KERNEL, _SPLIT and _PDL again
//                          (tests switch settings)
#include <Python.h>

#include <string>

#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#else
#include <torch/version.h>
#endif

#include "cpu/kernel_choice.h"
#include "cpu/threads_per_call.h"
#include "torch_glue/registered_kernels.h"
#ifdef PAGED_ATTN_WITH_CUDA
#include "core/cuda_arch.h"
#include "cuda/build_info.h"
#include "cuda/kernel_choice.h"
#include "cuda/kernel_families.h"
#endif

namespace {

#ifdef _OPENMP
constexpr long kOpenMP = 1;
#else
constexpr long kOpenMP = 0;
#endif

#define PA_STRINGIFY_(x) #x
#define PA_STRINGIFY(x) PA_STRINGIFY_(x)
#if defined(__clang__)
constexpr const char* kCompiler = "clang " PA_STRINGIFY(__clang_major__) "." PA_STRINGIFY(
    __clang_minor__) "." PA_STRINGIFY(__clang_patchlevel__);
#elif defined(__GNUC__)
constexpr const char* kCompiler = "gcc " __VERSION__;
#else
constexpr const char* kCompiler = "unknown";
#endif

PyObject* cpu_kernel(PyObject*, PyObject*) {
  std::string error;
  const paged_attn::cpu::KernelVariant* v = paged_attn::cpu::choose_variant(&error);
  if (v == nullptr) {
    PyErr_SetString(PyExc_ValueError, error.c_str());
    return nullptr;
  }
  return PyUnicode_FromString(v->name);
}

PyObject* cpu_kernel_variants(PyObject*, PyObject*) {
  const auto& statuses = paged_attn::cpu::variant_statuses();
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(statuses.size()));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < statuses.size(); ++i) {
    PyObject* item =
        Py_BuildValue("(sOs)", statuses[i].variant->name, statuses[i].runnable ? Py_True : Py_False,
                      statuses[i].note.c_str());
    if (item == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SetItem(list, static_cast<Py_ssize_t>(i), item);  // steals item
  }
  return list;
}

// dict[key] = value, stealing value; false (Python error set) on failure.
bool set_item(PyObject* dict, const char* key, PyObject* value) {
  if (value == nullptr) return false;
  const int rc = PyDict_SetItemString(dict, key, value);
  Py_DECREF(value);
  return rc == 0;
}

PyObject* cpu_threading(PyObject*, PyObject*) {
  const auto& policy = paged_attn::cpu::idle_thread_policy();
  std::string error;
  const int64_t min_bytes = paged_attn::cpu::min_kv_bytes_per_thread(&error);
  if (min_bytes <= 0) {
    PyErr_SetString(PyExc_ValueError, error.c_str());
    return nullptr;
  }
  PyObject* info = PyDict_New();
  if (info == nullptr) return nullptr;
  const bool ok =
      set_item(info, "idle_threads", PyUnicode_FromString(policy.sleep ? "sleep" : "spin")) &&
      set_item(info, "setting", PyUnicode_FromString(policy.setting.c_str())) &&
      set_item(info, "min_kv_bytes_per_thread", PyLong_FromLongLong(min_bytes)) &&
      set_item(info, "forced", PyBool_FromLong(paged_attn::cpu::kv_bytes_per_thread_forced()));
  if (!ok) Py_CLEAR(info);
  return info;
}

// list.append(value), stealing value.
bool append(PyObject* list, PyObject* value) {
  if (value == nullptr) return false;
  const int rc = PyList_Append(list, value);
  Py_DECREF(value);
  return rc == 0;
}

PyObject* cpu_variant_names() {
  PyObject* list = PyList_New(0);
  int count = 0;
  const paged_attn::cpu::KernelVariant* variants = paged_attn::cpu::kernel_variants(&count);
  for (int i = 0; list != nullptr && i < count; ++i)
    if (!append(list, PyUnicode_FromString(variants[i].name))) Py_CLEAR(list);
  return list;
}

PyObject* cpu_variant_scopes() {
  PyObject* dict = PyDict_New();
  int count = 0;
  const paged_attn::cpu::KernelVariant* variants = paged_attn::cpu::kernel_variants(&count);
  for (int i = 0; dict != nullptr && i < count; ++i)
    if (variants[i].scope != nullptr &&
        !set_item(dict, variants[i].name, PyUnicode_FromString(variants[i].scope)))
      Py_CLEAR(dict);
  return dict;
}

PyObject* registered_kernels() {
  PyObject* dict = PyDict_New();
  for (const auto& k : paged_attn::registered_kernels()) {
    if (dict == nullptr) break;
    PyObject* ops = PyDict_GetItemString(dict, k.dispatch_key.c_str());  // borrowed
    if (ops == nullptr) {
      if (!set_item(dict, k.dispatch_key.c_str(), PyList_New(0))) Py_CLEAR(dict);
      if (dict == nullptr) break;
      ops = PyDict_GetItemString(dict, k.dispatch_key.c_str());
    }
    if (!append(ops, PyUnicode_FromString(k.op.c_str()))) Py_CLEAR(dict);
  }
  return dict;
}

#ifdef PAGED_ATTN_WITH_CUDA
bool add_cuda_info(PyObject* info) {
  namespace cuda = paged_attn::cuda;
  std::vector<paged_attn::arch::Target> targets;
  paged_attn::arch::parse_targets(cuda::compiled_archs(), targets);
  PyObject* archs = PyList_New(0);
  for (const auto& t : targets)
    if (archs != nullptr && !append(archs, PyUnicode_FromString(t.name().c_str())))
      Py_CLEAR(archs);
  PyObject* pairs = PyList_New(0);
  for (const auto& p : cuda::attention_pairs())
    if (pairs != nullptr && !append(pairs, Py_BuildValue("(ss)", p.query_dtype, p.kv_cache_dtype)))
      Py_CLEAR(pairs);
  PyObject* sizes = PyList_New(0);
  for (int d : cuda::head_sizes())
    if (sizes != nullptr && !append(sizes, PyLong_FromLong(d))) Py_CLEAR(sizes);
  return set_item(info, "cuda", PyBool_FromLong(1)) && set_item(info, "cuda_archs", archs) &&
         set_item(info, "cuda_attention_pairs", pairs) &&
         set_item(info, "cuda_head_sizes", sizes) &&
         set_item(info, "cuda_runtime_version", PyLong_FromLong(cuda::cuda_runtime_version())) &&
         set_item(info, "cuda_attention_kernel",
                  PyUnicode_FromString(cuda::attention_kernel_setting().c_str())) &&
         set_item(info, "cuda_split", PyUnicode_FromString(cuda::split_setting().c_str())) &&
         set_item(info, "cuda_pdl", PyUnicode_FromString(cuda::pdl_setting().c_str())) &&
         set_item(info, "cuda_baseline_kernel",
                  PyUnicode_FromString(cuda::kBaselineOnEveryArch ? "every arch"
                                                                  : "below sm_80 only"));
}

PyObject* cuda_attention_launches(PyObject*, PyObject* args) {
  namespace cuda = paged_attn::cuda;
  int reload = 0;
  if (!PyArg_ParseTuple(args, "|p", &reload)) return nullptr;
  if (reload) cuda::reload_attention_kernel_setting();
  PyObject* dict = PyDict_New();
  for (int i = 0; i < cuda::kNumAttentionKernels; ++i) {
    const auto kernel = static_cast<cuda::AttentionKernel>(i);
    if (dict != nullptr &&
        !set_item(dict, cuda::attention_kernel_name(kernel),
                  PyLong_FromUnsignedLongLong(cuda::attention_launches(kernel))))
      Py_CLEAR(dict);
  }
  return dict;
}
#else
bool add_cuda_info(PyObject* info) {
  return set_item(info, "cuda", PyBool_FromLong(0)) &&
         set_item(info, "cuda_archs", PyList_New(0)) &&
         set_item(info, "cuda_attention_pairs", PyList_New(0)) &&
         set_item(info, "cuda_head_sizes", PyList_New(0)) &&
         set_item(info, "cuda_runtime_version", PyLong_FromLong(0)) &&
         set_item(info, "cuda_attention_kernel", PyUnicode_FromString("")) &&
         set_item(info, "cuda_split", PyUnicode_FromString("")) &&
         set_item(info, "cuda_pdl", PyUnicode_FromString("")) &&
         set_item(info, "cuda_baseline_kernel", PyUnicode_FromString(""));
}

PyObject* cuda_attention_launches(PyObject*, PyObject* args) {
  int reload = 0;
  if (!PyArg_ParseTuple(args, "|p", &reload)) return nullptr;
  return PyDict_New();
}
#endif

PyObject* build_info(PyObject*, PyObject*) {
  PyObject* info = PyDict_New();
  if (info == nullptr) return nullptr;
  const bool ok = set_item(info, "torch_version", PyUnicode_FromString(TORCH_VERSION)) &&
                  set_item(info, "cpu_kernel_variants", cpu_variant_names()) &&
                  set_item(info, "cpu_kernel_scopes", cpu_variant_scopes()) &&
                  set_item(info, "compiler", PyUnicode_FromString(kCompiler)) &&
                  set_item(info, "openmp", PyBool_FromLong(kOpenMP)) &&
                  set_item(info, "registered_kernels", registered_kernels()) &&
                  add_cuda_info(info);
  if (!ok) Py_CLEAR(info);
  return info;
}

PyMethodDef methods[] = {
    {"cpu_kernel", cpu_kernel, METH_NOARGS, "The CPU kernel variant the next call runs."},
    {"cpu_kernel_variants", cpu_kernel_variants, METH_NOARGS,
     "Every CPU kernel variant of this build, best first for this CPU: (name, runnable, note)."},
    {"cpu_threading", cpu_threading, METH_NOARGS,
     "How many threads a CPU call wakes (see paged_attention_ext.cpu_threading)."},
    {"build_info", build_info, METH_NOARGS,
     "What this build compiled and registered (see paged_attention_ext.build_info)."},
    {"cuda_attention_launches", cuda_attention_launches, METH_VARARGS,
     "Attention launches per CUDA kernel so far; reload=True re-reads the CUDA settings."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, methods};
  return PyModule_Create(&module_def);
}
