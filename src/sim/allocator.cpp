// Allocator (being written).
namespace gpumem::sim {}
