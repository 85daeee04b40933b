// Bounded reading of untrusted input (gpumem/core/input.hpp).
#include "gpumem/core/input.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <memory>

#include "gpumem/core/bytes.hpp"
#include "gpumem/core/result.hpp"

namespace gpumem {

namespace {

std::string kind_of(mode_t m) {
    if (S_ISDIR(m)) return "a folder";
    if (S_ISFIFO(m)) return "a pipe (FIFO)";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

std::int64_t stat_regular(const std::string& path, std::int64_t cap, std::string_view what) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
        const int err = errno;
        if (err == ENOENT || err == ENOTDIR) fail(ErrorCode::NotFound, path, path + ": no such file");
        if (err == ELOOP) fail(ErrorCode::InvalidArgument, path, path + ": too many levels of symbolic links (a link loop?); give the real file");
        fail(ErrorCode::Io, path, path + ": cannot read the " + std::string(what) + " file (" + std::strerror(err) + ")");
    }
    if (!S_ISREG(st.st_mode))
        fail(ErrorCode::InvalidArgument, path,
             path + ": is " + kind_of(st.st_mode) + "; a " + std::string(what) + " must be a regular file (save it to a file first)");
    const std::int64_t size = st.st_size;
    if (size > cap)
        fail(ErrorCode::InvalidArgument, path,
             path + ": is " + format_bytes(Bytes(size)) + ", larger than the " + format_bytes(Bytes(cap)) + " limit for a " +
                 std::string(what) + " file; check it is the right file (docs/security.md lists the limits)");
    return size;
}

}  // namespace

std::int64_t check_input_file(const std::string& path, std::int64_t cap, std::string_view what) {
    return stat_regular(path, cap, what);
}

std::string read_input_file(const std::string& path, std::int64_t cap, std::string_view what) {
    const std::int64_t size = stat_regular(path, cap, what);
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
    if (!f) fail(ErrorCode::Io, path, path + ": cannot open the " + std::string(what) + " file for reading (" + std::strerror(errno) + ")");
    std::string out;
    out.resize(static_cast<std::size_t>(size));
    std::size_t got = size > 0 ? std::fread(out.data(), 1, out.size(), f.get()) : 0;
    if (std::ferror(f.get())) fail(ErrorCode::Io, path, path + ": read error");
    out.resize(got);
    // A file that grew after stat() (or a /proc file reporting size 0) is read
    // on, up to the cap, and refused beyond it.
    char buf[65536];
    while (true) {
        const std::size_t n = std::fread(buf, 1, sizeof buf, f.get());
        if (n == 0) break;
        if (static_cast<std::int64_t>(out.size() + n) > cap)
            fail(ErrorCode::InvalidArgument, path,
                 path + ": grows past the " + format_bytes(Bytes(cap)) + " limit for a " + std::string(what) + " file while being read");
        out.append(buf, n);
    }
    if (std::ferror(f.get())) fail(ErrorCode::Io, path, path + ": read error");
    return out;
}

void check_json_text(std::string_view text, std::string_view origin, int max_depth, std::size_t max_values) {
    int depth = 0;
    std::size_t values = 1;
    bool in_string = false;
    for (std::size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (in_string) {
            if (c == '\\') ++i;
            else if (c == '"') in_string = false;
            continue;
        }
        if (c == '"') {
            in_string = true;
            continue;
        }
        if (c == ',' || c == '[' || c == '{') {
            if (++values > max_values)
                fail(ErrorCode::InvalidArgument, "",
                     std::string(origin) + ": more than " + std::to_string(max_values) +
                         " JSON values; no gpumem request holds that many, check the request");
        }
        if (c == '[' || c == '{') {
            if (++depth > max_depth)
                fail(ErrorCode::ParseError, std::string(origin),
                     std::string(origin) + ": JSON nested deeper than " + std::to_string(max_depth) + " levels at byte " +
                         std::to_string(i) + "; no gpumem input nests that deep, check the file or request");
        } else if (c == ']' || c == '}') {
            if (depth > 0) --depth;
        }
    }
}

void check_json_depth(std::string_view text, std::string_view origin, int max_depth) {
    check_json_text(text, origin, max_depth, static_cast<std::size_t>(-1));
}

std::int64_t parse_int_in_range(std::string_view text, std::string_view field, std::int64_t lo, std::int64_t hi) {
    std::int64_t v = 0;
    const char* b = text.data();
    const char* e = text.data() + text.size();
    auto [p, ec] = std::from_chars(b, e, v);
    const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    if (text.empty() || ec == std::errc::invalid_argument || p != e)
        fail(ErrorCode::InvalidArgument, std::string(field),
             std::string(field) + ": \"" + std::string(text.substr(0, 40)) + "\" is not a whole number; expected one in " + range);
    if (ec == std::errc::result_out_of_range || v < lo || v > hi)
        fail(ErrorCode::InvalidArgument, std::string(field),
             std::string(field) + ": " + std::string(text.substr(0, 40)) + " is out of range; expected a whole number in " + range);
    return v;
}

}  // namespace gpumem
