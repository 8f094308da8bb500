// Installs the caching allocator (tensor/caching_allocator.h) for sim devices at static
// initialization, so Storage on sim:N allocates through it, as cuda's does.
#include "tensor/caching_allocator.h"
#include "tensor/sim/sim.h"

namespace chorus::sim {
namespace {

// device_runtime() and the allocator registries are function-local statics, so this works
// whichever file's static initializers run first.
const bool g_allocator_installed = (install_caching_allocator(device_runtime()), true);

}  // namespace
}  // namespace chorus::sim
