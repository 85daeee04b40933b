// `gpumem trace`: see trace_command.hpp.
#include "trace_command.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "gpumem_tracer_py.hpp"

namespace gpumem::cli {

int run_trace_command(const std::vector<std::string>& args) {
    // GPUMEM_PYTHON names the interpreter that has torch (a venv's python);
    // otherwise python3 from PATH.
    const char* env = std::getenv("GPUMEM_PYTHON");
    const std::string python = env != nullptr && *env != '\0' ? env : "python3";
    std::vector<std::string> argv_s = {python, "-c", kTracerPy};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    argv.reserve(argv_s.size() + 1);
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0) {
        std::fprintf(stderr, "gpumem: error: trace: cannot start %s (%s)\n", python.c_str(), std::strerror(errno));
        return 2;
    }
    if (pid == 0) {
        execvp(argv[0], argv.data());
        std::fprintf(stderr,
                     "gpumem: error: trace needs Python 3 with PyTorch >= 1.13: cannot run %s (%s); set GPUMEM_PYTHON to "
                     "the interpreter that has torch\n",
                     python.c_str(), std::strerror(errno));
        std::_Exit(2);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return 2;
    if (WIFEXITED(status)) return WEXITSTATUS(status) == 0 ? 0 : 2;
    std::fprintf(stderr, "gpumem: error: trace: %s ended by signal %d\n", python.c_str(), WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    return 2;
}

}  // namespace gpumem::cli
