// module.cpp — the Python module `paged_attention_ext._C`. Importing it loads this shared library,
// which runs the static TORCH_LIBRARY registrations (ops.cpp, cpu/bindings_cpu.cpp, cuda/). Its
// only Python functions say which CPU kernel variant runs (paged_attention_ext.cpu_kernel()):
//   cpu_kernel() -> str                              the variant the next CPU call runs
//   cpu_kernel_variants() -> [(name, runnable, why_not)]   every variant of this build, best first
#include <Python.h>

#include <string>

#include "cpu/kernel_choice.h"

namespace {

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
                      statuses[i].why_not.c_str());
    if (item == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SetItem(list, static_cast<Py_ssize_t>(i), item);  // steals item
  }
  return list;
}

PyMethodDef methods[] = {
    {"cpu_kernel", cpu_kernel, METH_NOARGS, "The CPU kernel variant the next call runs."},
    {"cpu_kernel_variants", cpu_kernel_variants, METH_NOARGS,
     "Every CPU kernel variant of this build, best first: (name, runnable, why_not)."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, methods};
  return PyModule_Create(&module_def);
}
