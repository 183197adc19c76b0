// The C++ compiler's training input for the recorder's profile
// (tools/train-recorder): a fixed, self-contained file, so that the
// profile does not change when the project's own sources do. Templates,
// the standard containers, lambdas and <regex>, <variant>, <format>-free
// string work: the deep, varied call stacks of a real compile.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

namespace train {

struct Frame {
    uint32_t module = 0;
    uint64_t offset = 0;
    bool operator<(const Frame& o) const { return module != o.module ? module < o.module : offset < o.offset; }
    bool operator==(const Frame& o) const = default;
};

struct FrameHash {
    size_t operator()(const Frame& f) const { return std::hash<uint64_t>()(f.offset * 31 + f.module); }
};

using Stack = std::vector<Frame>;
using Value = std::variant<int64_t, double, std::string, std::vector<int64_t>>;

template <class Key, class T>
class Table {
public:
    T& at(const Key& k) { return items_[k]; }
    template <class Fn>
    void for_each(Fn&& fn) const {
        for (const auto& [k, v] : items_) fn(k, v);
    }
    size_t size() const { return items_.size(); }

private:
    std::map<Key, T> items_;
};

struct Site {
    int64_t bytes = 0;
    int64_t blocks = 0;
    std::set<uint32_t> threads;
};

std::string describe(const Value& v) {
    return std::visit(
        [](const auto& x) -> std::string {
            using X = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<X, std::string>) {
                return "\"" + x + "\"";
            } else if constexpr (std::is_same_v<X, std::vector<int64_t>>) {
                std::ostringstream out;
                out << '[';
                for (size_t i = 0; i < x.size(); ++i) out << (i ? "," : "") << x[i];
                out << ']';
                return out.str();
            } else {
                std::ostringstream out;
                out << x;
                return out.str();
            }
        },
        v);
}

std::vector<std::pair<std::string, int64_t>> parse(const std::string& text) {
    static const std::regex line(R"(^\s*([A-Za-z_][\w.]*)\s*=\s*(-?\d+)\s*$)");
    std::vector<std::pair<std::string, int64_t>> out;
    std::istringstream in(text);
    for (std::string s; std::getline(in, s);) {
        std::smatch m;
        if (std::regex_match(s, m, line)) out.emplace_back(m[1], std::stoll(m[2]));
    }
    return out;
}

class Aggregator {
public:
    void add(const Stack& stack, int64_t bytes, uint32_t thread) {
        Site& s = sites_.at(stack);
        s.bytes += bytes;
        s.blocks += bytes >= 0 ? 1 : -1;
        s.threads.insert(thread);
        for (const Frame& f : stack) ++frames_[f];
    }
    std::vector<std::pair<Stack, Site>> top(size_t n) const {
        std::vector<std::pair<Stack, Site>> all;
        sites_.for_each([&](const Stack& k, const Site& v) { all.emplace_back(k, v); });
        std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.second.bytes > b.second.bytes; });
        if (all.size() > n) all.resize(n);
        return all;
    }
    std::optional<Frame> hottest() const {
        if (frames_.empty()) return std::nullopt;
        return std::max_element(frames_.begin(), frames_.end(),
                                [](const auto& a, const auto& b) { return a.second < b.second; })
            ->first;
    }

private:
    Table<Stack, Site> sites_;
    std::unordered_map<Frame, uint64_t, FrameHash> frames_;
};

template <class... Fns>
struct Overload : Fns... {
    using Fns::operator()...;
};

int64_t weigh(const std::vector<Value>& values) {
    int64_t total = 0;
    for (const Value& v : values)
        std::visit(Overload{[&](int64_t x) { total += x; }, [&](double x) { total += static_cast<int64_t>(x); },
                            [&](const std::string& s) { total += static_cast<int64_t>(s.size()); },
                            [&](const std::vector<int64_t>& xs) {
                                total += std::accumulate(xs.begin(), xs.end(), int64_t{0});
                            }},
                   v);
    return total;
}

std::unique_ptr<Aggregator> build(const std::string& text) {
    auto agg = std::make_unique<Aggregator>();
    uint32_t thread = 0;
    for (const auto& [name, value] : parse(text)) {
        Stack stack;
        for (char c : name) stack.push_back(Frame{static_cast<uint32_t>(c % 7), static_cast<uint64_t>(c) * 16});
        agg->add(stack, value, thread++ % 4);
    }
    return agg;
}

}  // namespace train

int train_entry(const std::string& text) {
    auto agg = train::build(text);
    int64_t sum = 0;
    for (const auto& [stack, site] : agg->top(10)) sum += site.bytes + static_cast<int64_t>(stack.size());
    std::vector<train::Value> values{sum, 2.5, std::string("x"), std::vector<int64_t>{1, 2, 3}};
    for (const auto& v : values) sum += static_cast<int64_t>(train::describe(v).size());
    return static_cast<int>(sum + train::weigh(values) + (agg->hottest() ? 1 : 0));
}
