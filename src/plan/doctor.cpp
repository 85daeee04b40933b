// OOM doctor (being written).
namespace gpumem {}
