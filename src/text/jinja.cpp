// The Jinja2 subset of chat templates (jinja.h): a lexer that applies
// jinja2's whitespace rules, a recursive-descent parser that mirrors
// jinja2/parser.py's grammar, and a tree-walking evaluator with Python's value
// semantics and the sandbox's attribute rules.
#include "text/jinja.h"

#include <fmt/format.h>
#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "attn/utf8.h"

namespace attn::text::jinja {

// ---- limits: any template, however hostile, ends in an error ---------------------------------

constexpr int kMaxNesting = 200;          // parser recursion, nested values printed or compared
constexpr int kMaxMacroDepth = 100;       // macro calls inside macro calls
constexpr int64_t kMaxSteps = 5'000'000;  // statements and expressions evaluated in one render
constexpr size_t kMaxBytes = size_t{64} << 20;  // a string or the output
constexpr int64_t kMaxRange = 100'000;          // range()'s length, as jinja2.sandbox.MAX_RANGE

// An error while rendering, without its line: render() adds "NAME line N: ".
struct RenderError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A syntax error at a line.
struct SyntaxError : std::invalid_argument {
  SyntaxError(int line_, const std::string& what) : std::invalid_argument(what), line(line_) {}
  int line;
};

struct Context;
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};
struct Function {
  std::string name;
  std::function<Value(Context&, CallArgs&)> call;
};

namespace {

std::string quoted(std::string_view s) {
  std::string out = "'";  // (not "'" + ...: GCC 12's false -Wrestrict)
  out += printable(s, 80);
  out += "'";
  return out;
}

// ---- code points -------------------------------------------------------------------------------

std::u32string to_u32(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t cp = 0;
    const size_t n = utf8_sequence(s, i, cp);
    if (n == 0) {  // strings are checked where they enter; keep going on a stray byte
      out.push_back(0xFFFD);
      ++i;
    } else {
      out.push_back(cp);
      i += n;
    }
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string from_u32(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

// Python's str.isspace() (and re's \s on str): the characters str.strip() removes.
bool py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

size_t cp_count(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

// The UTF-8 lengths of the whitespace at the end and at the start of s.
std::string py_rstrip(std::string_view s) {
  const std::u32string u = to_u32(s);
  size_t e = u.size();
  while (e > 0 && py_space(u[e - 1])) --e;
  return from_u32(std::u32string_view(u).substr(0, e));
}

char32_t py_lower(char32_t c) {
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}
char32_t py_upper(char32_t c) {
  return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}
char32_t py_title(char32_t c) {
  return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c)));
}
bool py_cased(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}
bool py_printable(char32_t c) {
  if (c == ' ') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

std::string map_chars(std::string_view s, char32_t (*f)(char32_t)) {
  std::u32string u = to_u32(s);
  for (char32_t& c : u) c = f(c);
  return from_u32(u);
}

void check_size(size_t bytes) {
  if (bytes > kMaxBytes) {
    throw RenderError(
        fmt::format("a string of {} bytes passes the limit of {} bytes", bytes, kMaxBytes));
  }
}

// markupsafe.escape: & < > " ' as HTML entities.
std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// ---- Python's names and printing ---------------------------------------------------------------

const char* type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kList:
      return v.is_generator() ? "generator" : v.is_tuple() ? "tuple" : "list";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kNamespace:
      return "Namespace";
    case Value::Kind::kFunction:
      return "function";
  }
  return "object";
}

// jinja2.utils.object_type_repr: "None", "dict object", ...
std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  return std::string(type_name(v)) + " object";
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string s(buf, r.ptr);  // shortest round trip: "-1.2345e+02"
  const bool negative = s[0] == '-';
  if (negative) s.erase(0, 1);
  const size_t e = s.find('e');
  int exp = 0;
  std::from_chars(s.data() + e + 1 + (s[e + 1] == '+'), s.data() + s.size(), exp);
  std::string digits;
  for (size_t i = 0; i < e; ++i)
    if (s[i] != '.') digits += s[i];
  const int n = static_cast<int>(digits.size());
  std::string out;
  if (exp < -4 || exp >= 16) {  // repr's switch to scientific notation
    out = digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    out += exp < 0 ? "e-" : "e+";
    const int a = std::abs(exp);
    if (a < 10) out += '0';
    out += std::to_string(a);
  } else if (exp < 0) {
    out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else if (n <= exp + 1) {
    out = digits + std::string(static_cast<size_t>(exp + 1 - n), '0') + ".0";
  } else {
    out = digits.substr(0, static_cast<size_t>(exp + 1)) + "." +
          digits.substr(static_cast<size_t>(exp + 1));
  }
  return negative ? "-" + out : out;
}

std::string string_repr(std::string_view s) {
  const bool single = s.find('\'') != std::string_view::npos;
  const bool dbl = s.find('"') != std::string_view::npos;
  const char32_t q = single && !dbl ? U'"' : U'\'';
  std::string out(1, static_cast<char>(q));
  for (char32_t c : to_u32(s)) {
    if (c == q || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      out += fmt::format("\\x{:02x}", static_cast<uint32_t>(c));
    } else if (c < 0x7F || py_printable(c)) {
      append_utf8(out, c);
    } else if (c < 0x100) {
      out += fmt::format("\\x{:02x}", static_cast<uint32_t>(c));
    } else if (c < 0x10000) {
      out += fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
    } else {
      out += fmt::format("\\U{:08x}", static_cast<uint32_t>(c));
    }
  }
  out += static_cast<char>(q);
  return out;
}

void repr_into(std::string& out, const Value& v, int depth);

void str_into(std::string& out, const Value& v, int depth) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return;
    case Value::Kind::kNone:
      out += "None";
      return;
    case Value::Kind::kBool:
      out += v.as_bool() ? "True" : "False";
      return;
    case Value::Kind::kInt:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::kFloat:
      out += float_repr(v.as_float());
      return;
    case Value::Kind::kString:
      out += v.as_string();
      return;
    default:
      repr_into(out, v, depth);
  }
}

void repr_into(std::string& out, const Value& v, int depth) {
  if (depth > kMaxNesting) throw RenderError("a value nested too deeply to print");
  check_size(out.size());
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      out += "Undefined";
      return;
    case Value::Kind::kString:
      out += string_repr(v.as_string());
      return;
    case Value::Kind::kList: {
      if (v.is_generator()) {
        out += "<generator object>";
        return;
      }
      out += v.is_tuple() ? '(' : '[';
      const auto& items = v.as_list();
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ", ";
        repr_into(out, items[i], depth + 1);
      }
      if (v.is_tuple() && items.size() == 1) out += ',';
      out += v.is_tuple() ? ')' : ']';
      return;
    }
    case Value::Kind::kDict:
    case Value::Kind::kNamespace: {
      if (v.is_namespace()) out += "<Namespace ";
      out += '{';
      bool first = true;
      for (const auto& [k, x] : v.as_items()) {
        if (!first) out += ", ";
        first = false;
        repr_into(out, k, depth + 1);
        out += ": ";
        repr_into(out, x, depth + 1);
      }
      out += '}';
      if (v.is_namespace()) out += '>';
      return;
    }
    case Value::Kind::kFunction:
      out += "<function " + v.as_function().name + ">";
      return;
    default:
      str_into(out, v, depth);
  }
}

// ---- json.dumps
// ----------------------------------------------------------------------------------

struct JsonStyle {
  bool indent = false;
  std::string indent_text;
  std::string item_separator, key_separator;
  bool sort_keys = false;
};

void json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", c);
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

std::string json_key(const Value& k) {
  switch (k.kind()) {
    case Value::Kind::kString:
      return k.as_string();
    case Value::Kind::kInt:
      return std::to_string(k.as_int());
    case Value::Kind::kBool:
      return k.as_bool() ? "true" : "false";
    case Value::Kind::kNone:
      return "null";
    case Value::Kind::kFloat:
      return float_repr(k.as_float());
    default:
      throw RenderError(
          fmt::format("tojson: keys must be str, int, float, bool or None, not {}", type_name(k)));
  }
}

void json_into(std::string& out, const Value& v, const JsonStyle& st, int level) {
  if (level > kMaxNesting) throw RenderError("tojson: a value nested too deeply (or circular)");
  check_size(out.size());
  const auto newline = [&](int l) {
    if (!st.indent) return;
    out += '\n';
    for (int i = 0; i < l; ++i) out += st.indent_text;
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::kInt:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::kFloat: {
      const double d = v.as_float();
      if (std::isnan(d))
        out += "NaN";
      else if (std::isinf(d))
        out += d > 0 ? "Infinity" : "-Infinity";
      else
        out += float_repr(d);
      return;
    }
    case Value::Kind::kString:
      json_string(out, v.as_string());
      return;
    case Value::Kind::kList: {
      if (v.is_generator()) {
        throw RenderError("tojson: Object of type generator is not JSON serializable");
      }
      const auto& items = v.as_list();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += st.item_separator;
        newline(level + 1);
        json_into(out, items[i], st, level + 1);
      }
      newline(level);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      std::vector<std::pair<std::string, const Value*>> entries;
      for (const auto& [k, x] : v.as_items()) entries.emplace_back(json_key(k), &x);
      if (st.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      if (entries.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += st.item_separator;
        newline(level + 1);
        json_string(out, entries[i].first);
        out += st.key_separator;
        json_into(out, *entries[i].second, st, level + 1);
      }
      newline(level);
      out += '}';
      return;
    }
    default:
      throw RenderError(
          fmt::format("tojson: Object of type {} is not JSON serializable", type_name(v)));
  }
}

}  // namespace

// ---- Value ------------------------------------------------------------------------------------

void Value::nest(const Value& child) {
  depth_ = std::max(depth_, child.depth_ + 1);
  holds_ns_ = holds_ns_ || child.holds_ns_ || child.is_namespace();
  if (depth_ > kMaxNesting) {
    throw RenderError(fmt::format("a value nested more than {} levels deep", kMaxNesting));
  }
}
Value Value::list(std::vector<Value> items, bool tuple) {
  Value v(Kind::kList);
  v.tuple_ = tuple;
  v.depth_ = 1;
  for (const Value& x : items) v.nest(x);
  v.list_ = std::make_shared<const std::vector<Value>>(std::move(items));
  return v;
}
Value Value::generator(std::vector<Value> items) {
  Value v = list(std::move(items));
  v.lazy_ = true;
  return v;
}
Value Value::markup(std::string s) {
  Value v(std::move(s));
  v.lazy_ = true;
  return v;
}
Value Value::dict(Items items) {
  Value v(Kind::kDict);
  v.depth_ = 1;
  for (const auto& [k, x] : items) {
    v.nest(k);
    v.nest(x);
  }
  v.items_ = std::make_shared<Items>(std::move(items));
  return v;
}
Value Value::name_space(Items items) {
  Value v(Kind::kNamespace);
  v.depth_ = 1;
  for (const auto& [k, x] : items) {
    v.nest(k);
    v.nest(x);
  }
  if (v.holds_ns_) {
    throw RenderError("a namespace holding a namespace is outside the Jinja subset attn evaluates");
  }
  v.items_ = std::make_shared<Items>(std::move(items));
  return v;
}
Value Value::function(std::shared_ptr<const Function> fn, const Value* holds) {
  Value v(Kind::kFunction);
  if (holds != nullptr) v.nest(*holds);
  v.fn_ = std::move(fn);
  return v;
}
const Value* Value::find(std::string_view key) const {
  for (const auto& [k, v] : *items_)
    if (k.is_string() && k.as_string() == key) return &v;
  return nullptr;
}

std::string to_str(const Value& v) {
  std::string out;
  str_into(out, v, 0);
  return out;
}
std::string to_repr(const Value& v) {
  std::string out;
  repr_into(out, v, 0);
  return out;
}
std::string to_json(const Value& v, int indent, std::string_view item_separator,
                    std::string_view key_separator, bool sort_keys) {
  JsonStyle st{.indent = indent >= 0,
               .indent_text = std::string(static_cast<size_t>(std::max(indent, 0)), ' '),
               .item_separator = std::string(item_separator),
               .key_separator = std::string(key_separator),
               .sort_keys = sort_keys};
  std::string out;
  json_into(out, v, st, 0);
  return out;
}

// ---- the lexer ----------------------------------------------------------------------------------

namespace {

enum class Tok {
  kData,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  Tok type;
  std::string text;  // data, a name, an operator, a string literal's value
  int line;
  int64_t int_value = 0;
  double float_value = 0;
};

const char* describe(const Token& t) {
  switch (t.type) {
    case Tok::kData:
      return "template data";
    case Tok::kVarBegin:
      return "begin of print statement";
    case Tok::kVarEnd:
      return "end of print statement";
    case Tok::kBlockBegin:
      return "begin of statement block";
    case Tok::kBlockEnd:
      return "end of statement block";
    case Tok::kName:
      return "name";
    case Tok::kString:
      return "string";
    case Tok::kInt:
      return "integer";
    case Tok::kFloat:
      return "float";
    case Tok::kOp:
      return "operator";
    case Tok::kEof:
      return "end of template";
  }
  return "token";
}

std::string token_text(const Token& t) {
  if (t.type == Tok::kName || t.type == Tok::kOp) return "'" + printable(t.text, 40) + "'";
  return describe(t);
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // Newlines as jinja2 reads them: \r\n and \r are \n; one trailing newline dropped.
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') newlines_.push_back(i);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    const size_t n = src_.size();
    while (pos < n) {
      size_t t = pos;
      for (;; ++t) {
        t = src_.find('{', t);
        if (t == std::string::npos || t + 1 >= n) {
          t = std::string::npos;
          break;
        }
        const char k = src_[t + 1];
        if (k == '{' || k == '%' || k == '#') break;
      }
      if (t == std::string::npos) {
        emit_data(pos, src_.substr(pos));
        break;
      }
      const bool line_starting = pos == 0 || src_[pos - 1] == '\n';
      const char kind = src_[t + 1];
      size_t after = t + 2;
      // {% raw %} is matched before the plain block opener, as jinja2's root rule orders them.
      size_t raw_end = kind == '%' ? match_raw_begin(t) : 0;
      char sign = 0;
      if (after < n && (src_[after] == '-' || src_[after] == '+')) sign = src_[after++];
      std::string text = src_.substr(pos, t - pos);
      strip_before(text, sign, kind != '{', line_starting);
      emit_data(pos, std::move(text));
      if (raw_end != 0) {
        pos = lex_raw(raw_end);
      } else if (kind == '#') {
        pos = lex_comment(t, after);
      } else {
        tokens_.push_back({kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, "", line_of(t)});
        pos = lex_tag(after, kind == '%');
      }
    }
    tokens_.push_back({Tok::kEof, "", line_of(n)});
    return std::move(tokens_);
  }

 private:
  int line_of(size_t pos) const {
    return static_cast<int>(std::lower_bound(newlines_.begin(), newlines_.end(), pos) -
                            newlines_.begin()) +
           1;
  }
  [[noreturn]] void fail(size_t pos, const std::string& what) const {
    throw SyntaxError(line_of(pos), what);
  }

  void emit_data(size_t pos, std::string text) {
    if (!text.empty()) tokens_.push_back({Tok::kData, std::move(text), line_of(pos)});
  }

  // `{%-` strips all whitespace before the tag; otherwise lstrip_blocks strips
  // the spaces between a line's start and a block or comment tag.
  static void strip_before(std::string& text, char sign, bool lstrip, bool line_starting) {
    if (sign == '-') {
      text = py_rstrip(text);
    } else if (sign != '+' && lstrip) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting) && l_pos < text.size()) {
        const std::u32string rest = to_u32(std::string_view(text).substr(l_pos));
        if (std::all_of(rest.begin(), rest.end(), py_space)) text.resize(l_pos);
      }
    }
  }

  size_t skip_space(size_t p) const {
    while (p < src_.size()) {
      char32_t cp = 0;
      const size_t len = utf8_sequence(src_, p, cp);
      if (len == 0 || !py_space(cp)) break;
      p += len;
    }
    return p;
  }

  // `%}` and what trim_blocks and `-` take after it: the position after, or 0.
  size_t match_block_end(size_t p) const {
    if (src_.compare(p, 3, "+%}") == 0) return p + 3;
    if (src_.compare(p, 3, "-%}") == 0) return skip_space(p + 3);
    if (src_.compare(p, 2, "%}") == 0) return p + 2 + (p + 2 < src_.size() && src_[p + 2] == '\n');
    return 0;
  }

  // {%[-+]? raw [-]%}: the position after it, or 0.
  size_t match_raw_begin(size_t t) const {
    size_t p = t + 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    p = skip_space(p);
    if (src_.compare(p, 3, "raw") != 0) return 0;
    p = skip_space(p + 3);
    if (src_.compare(p, 3, "-%}") == 0) return skip_space(p + 3);
    if (src_.compare(p, 2, "%}") == 0) return p + 2;
    return 0;
  }

  size_t lex_raw(size_t start) {
    const bool line_starting = src_[start - 1] == '\n';
    for (size_t p = src_.find("{%", start); p != std::string::npos; p = src_.find("{%", p + 1)) {
      size_t q = p + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      q = skip_space(q);
      if (src_.compare(q, 6, "endraw") != 0) continue;
      const size_t end = match_block_end(skip_space(q + 6));
      if (end == 0) continue;
      std::string text = src_.substr(start, p - start);
      strip_before(text, sign, true, line_starting);
      emit_data(start, std::move(text));
      return end;
    }
    fail(start, "Missing end of raw directive");
  }

  size_t lex_comment(size_t t, size_t after) {
    const size_t q = src_.find("#}", after);
    if (q == std::string::npos) fail(t, "Missing end of comment tag");
    if (q > after && src_[q - 1] == '-') return skip_space(q + 2);
    if (q > after && src_[q - 1] == '+') return q + 2;
    return q + 2 + (q + 2 < src_.size() && src_[q + 2] == '\n');
  }

  // The tokens of {{ ... }} or {% ... %} from p, through its end tag.
  size_t lex_tag(size_t p, bool block) {
    std::vector<char> balance;  // closing brackets expected
    const size_t n = src_.size();
    while (true) {
      if (p >= n)
        fail(p, block ? "unexpected end of template: a {% tag is not closed with %}"
                      : "unexpected end of template: a {{ tag is not closed with }}");
      if (balance.empty()) {
        if (block) {
          if (const size_t end = match_block_end(p); end != 0) {
            tokens_.push_back({Tok::kBlockEnd, "", line_of(p)});
            return end;
          }
        } else if (src_.compare(p, 3, "-}}") == 0) {
          tokens_.push_back({Tok::kVarEnd, "", line_of(p)});
          return skip_space(p + 3);
        } else if (src_.compare(p, 2, "}}") == 0) {
          tokens_.push_back({Tok::kVarEnd, "", line_of(p)});
          return p + 2;
        }
      }
      if (const size_t s = skip_space(p); s != p) {
        p = s;
        continue;
      }
      const char c = src_[p];
      if (is_digit(c)) {
        p = lex_number(p);
      } else if (is_name_start(c)) {
        size_t e = p;
        while (e < n && is_name_char(src_[e])) ++e;
        tokens_.push_back({Tok::kName, src_.substr(p, e - p), line_of(p)});
        p = e;
      } else if (c == '\'' || c == '"') {
        p = lex_string(p);
      } else {
        static const char* const kOps2[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* o : kOps2)
          if (src_.compare(p, 2, o) == 0) op = o;
        if (op.empty()) {
          if (std::string_view("+-/*%~[](){}<>=.:|,;").find(c) == std::string_view::npos) {
            char32_t cp = 0;
            const size_t len = utf8_sequence(src_, p, cp);
            fail(p, fmt::format("unexpected char {} at {}",
                                quoted(src_.substr(p, len == 0 ? 1 : len)), p));
          }
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") {
          balance.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
          if (balance.size() > static_cast<size_t>(kMaxNesting))
            fail(p, "brackets nested too deeply");
        } else if (op == ")" || op == "]" || op == "}") {
          if (balance.empty()) fail(p, fmt::format("unexpected '{}'", op));
          if (balance.back() != op[0])
            fail(p, fmt::format("unexpected '{}', expected '{}'", op, balance.back()));
          balance.pop_back();
        }
        tokens_.push_back({Tok::kOp, op, line_of(p)});
        p += op.size();
      }
    }
  }

  // (\d+_)*\d+ from p: its end, or npos.
  size_t digits(size_t p) const {
    if (p >= src_.size() || !is_digit(src_[p])) return std::string::npos;
    while (p < src_.size()) {
      if (is_digit(src_[p])) {
        ++p;
      } else if (src_[p] == '_' && p + 1 < src_.size() && is_digit(src_[p + 1])) {
        ++p;
      } else {
        break;
      }
    }
    return p;
  }

  size_t lex_number(size_t p) {
    const int line = line_of(p);
    const size_t int_end = digits(p);
    // A float: digits, then .digits and/or an exponent (not right after a '.': x.0.1).
    size_t float_end = std::string::npos;
    if (p == 0 || src_[p - 1] != '.') {
      auto exponent = [&](size_t q) -> size_t {
        if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
          ++q;
          if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
          return digits(q);
        }
        return std::string::npos;
      };
      size_t frac = std::string::npos;
      if (int_end < src_.size() && src_[int_end] == '.') frac = digits(int_end + 1);
      if (frac != std::string::npos) float_end = exponent(frac);
      if (float_end == std::string::npos) float_end = exponent(int_end);
      if (float_end == std::string::npos) float_end = frac;
    }
    auto clean = [&](size_t a, size_t b) {
      std::string s;
      for (size_t i = a; i < b; ++i)
        if (src_[i] != '_') s += src_[i];
      return s;
    };
    if (float_end != std::string::npos) {
      const std::string s = clean(p, float_end);
      Token t{Tok::kFloat, s, line};
      std::from_chars(s.data(), s.data() + s.size(), t.float_value);
      tokens_.push_back(std::move(t));
      return float_end;
    }
    int base = 10;
    size_t start = p, end = int_end;
    if (src_[p] == '0' && p + 1 < src_.size()) {
      const char b = static_cast<char>(src_[p + 1] | 0x20);
      auto valid = [&](char ch) {
        ch = static_cast<char>(ch | 0x20);
        if (base == 2) return ch == '0' || ch == '1';
        if (base == 8) return ch >= '0' && ch <= '7';
        return is_digit(ch) || (ch >= 'a' && ch <= 'f');
      };
      if (b == 'b' || b == 'o' || b == 'x') {
        base = b == 'b' ? 2 : b == 'o' ? 8 : 16;
        size_t q = p + 2;
        while (q < src_.size() &&
               (valid(src_[q]) || (src_[q] == '_' && q + 1 < src_.size() && valid(src_[q + 1]))))
          ++q;
        if (q == p + 2) {
          base = 10;  // "0x" without digits: the integer 0, then a name
        } else {
          start = p + 2;
          end = q;
        }
      }
      if (base == 10) {  // 0(_?0)*: a leading zero takes zeros only
        end = p + 1;
        while (end < src_.size() &&
               (src_[end] == '0' ||
                (src_[end] == '_' && end + 1 < src_.size() && src_[end + 1] == '0')))
          ++end;
      }
    }
    const std::string s = clean(start, end);
    Token t{Tok::kInt, src_.substr(p, end - p), line};
    const auto r = std::from_chars(s.data(), s.data() + s.size(), t.int_value, base);
    if (r.ec != std::errc())
      fail(p, fmt::format("the integer {} does not fit in 64 bits", quoted(t.text)));
    tokens_.push_back(std::move(t));
    return end;
  }

  // A string literal from p, with Python's escapes (jinja2 decodes it with
  // "unicode-escape").
  size_t lex_string(size_t p) {
    const char q = src_[p];
    size_t e = p + 1;
    while (e < src_.size() && src_[e] != q) e += src_[e] == '\\' ? 2 : 1;
    if (e >= src_.size()) fail(p, "unexpected end of string: the literal is not closed");
    std::string out;
    const auto hex = [&](size_t at, int count) -> char32_t {
      if (at + static_cast<size_t>(count) > e)
        fail(at, "truncated \\x, \\u or \\U escape in a string");
      uint32_t v = 0;
      for (int k = 0; k < count; ++k) {
        const char h = src_[at + static_cast<size_t>(k)];
        const int d = is_digit(h)                              ? h - '0'
                      : (h | 0x20) >= 'a' && (h | 0x20) <= 'f' ? (h | 0x20) - 'a' + 10
                                                               : -1;
        if (d < 0) fail(at, "truncated \\x, \\u or \\U escape in a string");
        v = v * 16 + static_cast<uint32_t>(d);
      }
      if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        fail(at, fmt::format("the escape \\U{:08x} is not a Unicode scalar value", v));
      return v;
    };
    for (size_t i = p + 1; i < e;) {
      if (src_[i] != '\\') {
        out += src_[i++];
        continue;
      }
      const char c = src_[i + 1];
      i += 2;
      switch (c) {
        case '\n':
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'v':
          out += '\v';
          break;
        case 'x':
          append_utf8(out, hex(i, 2));
          i += 2;
          break;
        case 'u':
          append_utf8(out, hex(i, 4));
          i += 4;
          break;
        case 'U':
          append_utf8(out, hex(i, 8));
          i += 8;
          break;
        case 'N':
          fail(i, "\\N{...} escapes are not supported");
        default:
          if (c >= '0' && c <= '7') {
            uint32_t v = static_cast<uint32_t>(c - '0');
            for (int k = 0; k < 2 && i < e && src_[i] >= '0' && src_[i] <= '7'; ++k)
              v = v * 8 + static_cast<uint32_t>(src_[i++] - '0');
            append_utf8(out, v);
          } else {
            out += '\\';
            out += c;
          }
      }
    }
    tokens_.push_back({Tok::kString, std::move(out), line_of(p)});
    return e + 1;
  }

  std::string src_;
  std::vector<size_t> newlines_;
  std::vector<Token> tokens_;
};

}  // namespace

// ---- the syntax tree
// ------------------------------------------------------------------------------

namespace {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
struct Expr {
  enum class Kind {
    kConst,
    kName,
    kAttr,
    kItem,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kNeg,
    kPos,
    kNot,
    kBinary,
    kConcat,
    kCompare,
    kAnd,
    kOr,
    kCond,
    kList,
    kTuple,
    kDict,
  };
  Kind kind;
  int line;
  Value value;                // kConst
  std::string name;           // kName; kAttr's attribute; kFilter's, kTest's name; kBinary's op
  std::vector<ExprPtr> args;  // operands; kCall: callee then arguments; kFilter/kTest: operand
                              // (null in a filter block) then arguments; kSlice: start, stop,
                              // step (each may be null); kDict: key, value, key, value ...
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // kCompare: the operators between args
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;
struct Stmt {
  enum class Kind {
    kData,
    kPrint,
    kIf,
    kFor,
    kSet,
    kSetBlock,
    kMacro,
    kWith,
    kFilterBlock,
    kBreak,
    kContinue,
    kBody
  };
  Kind kind;
  int line;
  std::string text;                  // kData; kMacro's name; kSet's namespace attribute
  ExprPtr expr;                      // kPrint, kSet's value, kFor's iterable
  ExprPtr cond;                      // kFor's `if`
  std::vector<std::string> targets;  // kFor, kSet, kSetBlock: the names assigned
  bool unpack = false;               // targets were written as a tuple
  std::vector<std::pair<ExprPtr, Body>> branches;  // kIf: (condition, body) for if and each elif
  Body body, else_body;
  std::vector<std::pair<std::string, ExprPtr>>
      params;                    // kMacro: (name, default); kWith: assignments
  std::vector<ExprPtr> filters;  // kSetBlock, kFilterBlock: filters with no operand
};

const std::unordered_set<std::string>& filter_names() {
  static const std::unordered_set<std::string> names = {
      "abs",    "attr",   "capitalize", "count",      "d",           "default", "dictsort",
      "e",      "escape", "first",      "float",      "forceescape", "indent",  "int",
      "items",  "join",   "last",       "length",     "list",        "lower",   "map",
      "max",    "min",    "reject",     "rejectattr", "replace",     "reverse", "round",
      "safe",   "select", "selectattr", "sort",       "string",      "sum",     "title",
      "tojson", "trim",   "unique",     "upper",      "wordcount"};
  return names;
}
const std::unordered_set<std::string>& test_names() {
  static const std::unordered_set<std::string> names = {
      "boolean",     "callable", "defined",   "divisibleby", "eq",      "equalto",  "==",
      "escaped",     "even",     "false",     "filter",      "float",   "ge",       ">=",
      "greaterthan", "gt",       ">",         "in",          "integer", "iterable", "le",
      "<=",          "lessthan", "lower",     "lt",          "<",       "mapping",  "ne",
      "!=",          "none",     "number",    "odd",         "sameas",  "sequence", "string",
      "test",        "true",     "undefined", "upper"};
  return names;
}

// jinja2's builtin filters and tests that attn does not evaluate: named as such in the error.
bool jinja_builtin(const std::string& name) {
  static const std::unordered_set<std::string> names = {
      "batch", "center",    "filesizeformat", "format",    "groupby", "pprint",   "random",
      "slice", "striptags", "truncate",       "urlencode", "urlize",  "wordwrap", "xmlattr"};
  return names.count(name) != 0;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  Body parse_template() {
    Body body = subparse({});
    if (cur().type != Tok::kEof) fail(fmt::format("unexpected {}", token_text(cur())));
    return body;
  }

 private:
  struct Depth {
    explicit Depth(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxNesting) p_.fail(fmt::format("nested more than {} deep", kMaxNesting));
    }
    ~Depth() { --p_.depth_; }
    Parser& p_;
  };

  const Token& cur() const { return toks_[i_]; }
  const Token& peek(size_t k = 1) const { return toks_[std::min(i_ + k, toks_.size() - 1)]; }
  void next() {
    if (i_ + 1 < toks_.size()) ++i_;
  }
  [[noreturn]] void fail(const std::string& what) const { throw SyntaxError(cur().line, what); }
  bool is_op(const char* op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool is_name(const char* name) const { return cur().type == Tok::kName && cur().text == name; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(fmt::format("expected '{}', got {}", op, token_text(cur())));
  }
  void expect(Tok type) {
    if (cur().type != type) {
      fail(fmt::format("expected {}, got {}", describe(Token{type, "", 0}), token_text(cur())));
    }
    next();
  }
  std::string expect_name() {
    if (cur().type != Tok::kName) fail(fmt::format("expected a name, got {}", token_text(cur())));
    std::string s = cur().text;
    next();
    return s;
  }
  void expect_end_tag(const char* name) {
    if (!skip_name(name)) fail(fmt::format("expected '{}', got {}", name, token_text(cur())));
    expect(Tok::kBlockEnd);
  }

  // Statements until a {% tag %} named in `ends` (left as the current token) or the end.
  Body subparse(const std::vector<const char*>& ends) {
    Depth d(*this);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::kData) {
        auto s = make_stmt(Stmt::Kind::kData);
        s->text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.type == Tok::kVarBegin) {
        next();
        auto s = make_stmt(Stmt::Kind::kPrint);
        s->expr = parse_tuple(true, {});
        expect(Tok::kVarEnd);
        body.push_back(std::move(s));
      } else if (t.type == Tok::kBlockBegin) {
        next();
        if (cur().type == Tok::kName) {
          for (const char* e : ends)
            if (cur().text == e) return body;
        }
        body.push_back(parse_statement());
      } else if (t.type == Tok::kEof) {
        if (!ends.empty()) {
          std::string want;
          for (const char* e : ends) want += (want.empty() ? "'" : " or '") + std::string(e) + "'";
          fail("unexpected end of template: expected the tag " + want);
        }
        return body;
      } else {
        fail(fmt::format("unexpected {}", token_text(t)));
      }
    }
  }

  StmtPtr make_stmt(Stmt::Kind k) const {
    auto s = std::make_unique<Stmt>();
    s->kind = k;
    s->line = cur().line;
    return s;
  }
  ExprPtr make_expr(Expr::Kind k, int line) const {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  StmtPtr parse_statement() {
    Depth d(*this);
    if (cur().type != Tok::kName) fail(fmt::format("tag name expected, got {}", token_text(cur())));
    const std::string tag = cur().text;
    if (tag == "if") return parse_if();
    if (tag == "for") return parse_for();
    if (tag == "set") return parse_set();
    if (tag == "macro") return parse_macro();
    if (tag == "with") return parse_with();
    if (tag == "filter") return parse_filter_block();
    if (tag == "break" || tag == "continue") {
      auto s = make_stmt(tag == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue);
      if (loop_depth_ == 0) fail(fmt::format("'{}' outside of a loop", tag));
      next();
      expect(Tok::kBlockEnd);
      return s;
    }
    if (tag == "generation") {  // transformers' AssistantTracker: the body as it is
      auto s = make_stmt(Stmt::Kind::kBody);
      next();
      expect(Tok::kBlockEnd);
      s->body = subparse({"endgeneration"});
      expect_end_tag("endgeneration");
      return s;
    }
    static const std::unordered_set<std::string> refused = {
        "extends", "block", "include", "import", "from", "call", "do", "autoescape", "print"};
    if (refused.count(tag) != 0) {
      fail(fmt::format("the tag '{}' is outside the Jinja subset attn evaluates", tag));
    }
    fail(fmt::format("Encountered unknown tag {}", quoted(tag)));
  }

  StmtPtr parse_if() {
    auto s = make_stmt(Stmt::Kind::kIf);
    next();
    while (true) {
      ExprPtr cond = parse_tuple(false, {});
      expect(Tok::kBlockEnd);
      ++soft_;
      Body body = subparse({"elif", "else", "endif"});
      --soft_;
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (skip_name("elif")) continue;
      if (skip_name("else")) {
        expect(Tok::kBlockEnd);
        ++soft_;
        s->else_body = subparse({"endif"});
        --soft_;
      }
      expect_end_tag("endif");
      return s;
    }
  }

  // Names for `for` and `set`: `a`, `a, b`, `(a, b)`.
  void parse_targets(Stmt& s, const char* stop) {
    const bool parens = skip_op("(");
    while (true) {
      if (cur().type != Tok::kName || is_name(stop))
        fail(fmt::format("expected a name to assign to, got {}", token_text(cur())));
      s.targets.push_back(expect_name());
      if (!skip_op(",")) break;
      s.unpack = true;
      if (parens ? is_op(")") : (is_name(stop) || is_op("="))) break;
    }
    if (parens) {
      expect_op(")");
      s.unpack = true;
    }
  }

  StmtPtr parse_for() {
    auto s = make_stmt(Stmt::Kind::kFor);
    next();
    parse_targets(*s, "in");
    if (!skip_name("in")) fail(fmt::format("expected 'in', got {}", token_text(cur())));
    s->expr = parse_tuple(false, {"recursive", "if"});
    if (skip_name("if")) s->cond = parse_expression();
    if (is_name("recursive")) fail("recursive loops are outside the Jinja subset attn evaluates");
    expect(Tok::kBlockEnd);
    ++loop_depth_;
    const int saved_soft = soft_;
    soft_ = 0;
    s->body = subparse({"endfor", "else"});
    soft_ = saved_soft;
    --loop_depth_;
    if (skip_name("else")) {
      expect(Tok::kBlockEnd);
      s->else_body = subparse({"endfor"});
    }
    expect_end_tag("endfor");
    return s;
  }

  StmtPtr parse_set() {
    auto s = make_stmt(Stmt::Kind::kSet);
    next();
    if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == ".") {
      s->targets.push_back(expect_name());  // ns.attr = value
      next();
      s->text = expect_name();
      expect_op("=");
      s->expr = parse_tuple(true, {});
      expect(Tok::kBlockEnd);
      return s;
    }
    parse_targets(*s, "");
    if (skip_op("=")) {
      s->expr = parse_tuple(true, {});
      expect(Tok::kBlockEnd);
      return s;
    }
    if (s->unpack) fail("a block set assigns one name");
    s->kind = Stmt::Kind::kSetBlock;
    while (is_op("|")) s->filters.push_back(parse_filter(nullptr));
    expect(Tok::kBlockEnd);
    s->body = subparse({"endset"});
    expect_end_tag("endset");
    return s;
  }

  StmtPtr parse_macro() {
    auto s = make_stmt(Stmt::Kind::kMacro);
    next();
    s->text = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      if (!s->params.empty()) expect_op(",");
      if (is_op(")")) break;
      std::string name = expect_name();
      ExprPtr def;
      if (skip_op("=")) {
        def = parse_expression();
      } else if (!s->params.empty() && s->params.back().second) {
        fail("a macro parameter without a default follows one with a default");
      }
      s->params.emplace_back(std::move(name), std::move(def));
    }
    next();
    expect(Tok::kBlockEnd);
    const int saved = loop_depth_, saved_soft = soft_;
    loop_depth_ = 0;
    soft_ = 0;
    s->body = subparse({"endmacro"});
    loop_depth_ = saved;
    soft_ = saved_soft;
    expect_end_tag("endmacro");
    return s;
  }

  StmtPtr parse_with() {
    auto s = make_stmt(Stmt::Kind::kWith);
    next();
    while (cur().type != Tok::kBlockEnd) {
      if (!s->params.empty()) expect_op(",");
      std::string name = expect_name();
      expect_op("=");
      s->params.emplace_back(std::move(name), parse_expression());
    }
    next();
    s->body = subparse({"endwith"});
    expect_end_tag("endwith");
    return s;
  }

  StmtPtr parse_filter_block() {
    auto s = make_stmt(Stmt::Kind::kFilterBlock);
    next();
    s->filters.push_back(parse_filter(nullptr, true));
    while (is_op("|")) s->filters.push_back(parse_filter(nullptr));
    expect(Tok::kBlockEnd);
    s->body = subparse({"endfilter"});
    expect_end_tag("endfilter");
    return s;
  }

  // ---- expressions, lowest precedence first (jinja2/parser.py) ----

  bool at_tuple_end(const std::vector<const char*>& extra_ends) const {
    const Token& t = cur();
    if (t.type == Tok::kVarEnd || t.type == Tok::kBlockEnd || t.type == Tok::kEof) return true;
    if (t.type == Tok::kOp && t.text == ")") return true;
    if (t.type == Tok::kName)
      for (const char* e : extra_ends)
        if (t.text == e) return true;
    return false;
  }

  // expr, or expr, expr, ... as a tuple
  ExprPtr parse_tuple(bool with_condexpr, const std::vector<const char*>& extra_ends,
                      bool explicit_parens = false) {
    const int line = cur().line;
    std::vector<ExprPtr> items;
    bool tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (at_tuple_end(extra_ends)) break;
      items.push_back(with_condexpr ? parse_expression() : parse_or());
      if (is_op(",")) {
        tuple = true;
      } else {
        break;
      }
    }
    if (!tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) fail(fmt::format("Expected an expression, got {}", token_text(cur())));
    }
    auto e = make_expr(Expr::Kind::kTuple, line);
    e->args = std::move(items);
    return e;
  }

  ExprPtr parse_expression() {
    Depth d(*this);
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const int line = cur().line;
      next();
      auto c = make_expr(Expr::Kind::kCond, line);
      c->args.push_back(std::move(e));
      c->args.push_back(parse_or());
      if (skip_name("else")) c->args.push_back(parse_expression());
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(Expr::Kind k, ExprPtr a, ExprPtr b, std::string op = {}) {
    auto e = make_expr(k, a->line);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (skip_name("or")) e = binary(Expr::Kind::kOr, std::move(e), parse_and());
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (skip_name("and")) e = binary(Expr::Kind::kAnd, std::move(e), parse_not());
    return e;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      Depth d(*this);
      auto e = make_expr(Expr::Kind::kNot, cur().line);
      next();
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr first = parse_math1();
    std::unique_ptr<Expr> cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::kOp &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
           cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().type == Tok::kName && peek().text == "in") {
        op = "not in";
        next();
        next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = make_expr(Expr::Kind::kCompare, first->line);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = cur().text;
      next();
      e = binary(Expr::Kind::kBinary, std::move(e), parse_concat(), op);
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    if (!is_op("~")) return e;
    auto c = make_expr(Expr::Kind::kConcat, e->line);
    c->args.push_back(std::move(e));
    while (skip_op("~")) c->args.push_back(parse_math2());
    return c;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = cur().text;
      next();
      e = binary(Expr::Kind::kBinary, std::move(e), parse_pow(), op);
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (skip_op("**")) e = binary(Expr::Kind::kBinary, std::move(e), parse_unary(true), "**");
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    Depth d(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = make_expr(is_op("-") ? Expr::Kind::kNeg : Expr::Kind::kPos, cur().line);
      next();
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    Depth d(*this);
    const Token& t = cur();
    const int line = t.line;
    if (t.type == Tok::kName) {
      auto e = make_expr(Expr::Kind::kConst, line);
      if (t.text == "true" || t.text == "True") {
        e->value = Value(true);
      } else if (t.text == "false" || t.text == "False") {
        e->value = Value(false);
      } else if (t.text == "none" || t.text == "None") {
        e->value = Value::none();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = t.text;
      }
      next();
      return e;
    }
    if (t.type == Tok::kString) {
      std::string s = t.text;
      next();
      while (cur().type == Tok::kString) {  // adjacent literals join, as in Python
        s += cur().text;
        next();
      }
      auto e = make_expr(Expr::Kind::kConst, line);
      e->value = Value(std::move(s));
      return e;
    }
    if (t.type == Tok::kInt || t.type == Tok::kFloat) {
      auto e = make_expr(Expr::Kind::kConst, line);
      e->value = t.type == Tok::kInt ? Value(t.int_value) : Value(t.float_value);
      next();
      return e;
    }
    if (skip_op("(")) {
      ExprPtr e = parse_tuple(true, {}, true);
      expect_op(")");
      return e;
    }
    if (skip_op("[")) {
      auto e = make_expr(Expr::Kind::kList, line);
      while (!is_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("]")) break;
        e->args.push_back(parse_expression());
      }
      next();
      return e;
    }
    if (skip_op("{")) {
      auto e = make_expr(Expr::Kind::kDict, line);
      while (!is_op("}")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("}")) break;
        e->args.push_back(parse_expression());
        expect_op(":");
        e->args.push_back(parse_expression());
      }
      next();
      return e;
    }
    fail(fmt::format("unexpected {}", token_text(t)));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        e = parse_filter(std::move(e));
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    Depth d(*this);
    const int line = cur().line;
    if (skip_op(".")) {
      if (cur().type == Tok::kName) {
        auto e = make_expr(Expr::Kind::kAttr, line);
        e->name = cur().text;
        next();
        e->args.push_back(std::move(obj));
        return e;
      }
      if (cur().type != Tok::kInt)
        fail(fmt::format("expected name or number, got {}", token_text(cur())));
      auto idx = make_expr(Expr::Kind::kConst, line);
      idx->value = Value(cur().int_value);
      next();
      return binary(Expr::Kind::kItem, std::move(obj), std::move(idx));
    }
    expect_op("[");
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) {
        expect_op(",");
        if (is_op("]")) break;
      }
      args.push_back(parse_subscribed());
    }
    next();
    if (args.empty()) fail("expected a subscript");
    if (args.size() == 1) return binary(Expr::Kind::kItem, std::move(obj), std::move(args[0]));
    auto tup = make_expr(Expr::Kind::kTuple, line);
    tup->args = std::move(args);
    return binary(Expr::Kind::kItem, std::move(obj), std::move(tup));
  }

  ExprPtr parse_subscribed() {
    const int line = cur().line;
    auto slice = make_expr(Expr::Kind::kSlice, line);
    if (skip_op(":")) {
      slice->args.push_back(nullptr);
    } else {
      ExprPtr e = parse_expression();
      if (!skip_op(":")) return e;
      slice->args.push_back(std::move(e));
    }
    const auto end_of_part = [&] { return is_op(":") || is_op("]") || is_op(","); };
    slice->args.push_back(end_of_part() ? nullptr : parse_expression());
    if (skip_op(":")) {
      slice->args.push_back(is_op("]") || is_op(",") ? nullptr : parse_expression());
    } else {
      slice->args.push_back(nullptr);
    }
    return slice;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) {
        expect_op(",");
        if (is_op(")")) break;
      }
      first = false;
      if (is_op("*") || is_op("**"))
        fail("*args and **kwargs in calls are outside the Jinja subset attn evaluates");
      if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == "=") {
        std::string key = expect_name();
        next();
        e.kwargs.emplace_back(std::move(key), parse_expression());
      } else {
        if (!e.kwargs.empty()) fail("a positional argument follows a keyword argument");
        e.args.push_back(parse_expression());
      }
    }
    next();
  }

  ExprPtr parse_call(ExprPtr callee) {
    Depth d(*this);
    auto e = make_expr(Expr::Kind::kCall, cur().line);
    e->args.push_back(std::move(callee));
    parse_call_args(*e);
    return e;
  }

  std::string dotted_name() {
    std::string name = expect_name();
    while (skip_op(".")) name += "." + expect_name();
    return name;
  }

  // |name or |name(args); `inline_start` reads the name without a '|' (a filter block).
  ExprPtr parse_filter(ExprPtr operand, bool inline_start = false) {
    Depth d(*this);
    if (!inline_start) expect_op("|");
    auto e = make_expr(Expr::Kind::kFilter, cur().line);
    e->name = dotted_name();
    // jinja2 refuses an unknown filter when it compiles the template, except in the body of an
    // if (a "soft frame"), where it fails only when reached; attn refuses one of jinja2's own
    // filters that it does not evaluate when reached.
    if (filter_names().count(e->name) == 0 && !jinja_builtin(e->name) && soft_ == 0) {
      fail(fmt::format("No filter named {}", quoted(e->name)));
    }
    e->args.push_back(std::move(operand));
    if (is_op("(")) parse_call_args(*e);
    return e;
  }

  ExprPtr parse_test(ExprPtr operand) {
    Depth d(*this);
    const int line = cur().line;
    next();  // is
    const bool negated = skip_name("not");
    auto e = make_expr(Expr::Kind::kTest, line);
    if (cur().type == Tok::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                   cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
      e->name = cur().text;  // jinja2 registers "==" etc. as test names, but they cannot be written
      fail(fmt::format("expected a test name, got {}", token_text(cur())));
    }
    e->name = dotted_name();
    if (test_names().count(e->name) == 0 && soft_ == 0)
      fail(fmt::format("No test named {}", quoted(e->name)));
    e->args.push_back(std::move(operand));
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((cur().type == Tok::kName || cur().type == Tok::kString || cur().type == Tok::kInt ||
                cur().type == Tok::kFloat || is_op("(") || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail("You cannot chain multiple tests with is");
      e->args.push_back(parse_postfix(parse_primary()));
    }
    if (!negated) return e;
    auto n = make_expr(Expr::Kind::kNot, line);
    n->args.push_back(std::move(e));
    return n;
  }

  std::vector<Token> toks_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  int soft_ = 0;  // > 0 directly in the body of an if
};

}  // namespace

// ---- evaluation ---------------------------------------------------------------------------------

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
};
using ScopePtr = std::shared_ptr<Scope>;

struct Context {
  int line = 0;
  int64_t steps = 0;
  int macro_depth = 0;
  void step() {
    if (++steps > kMaxSteps) {
      throw RenderError(fmt::format("the template ran more than {} steps", kMaxSteps));
    }
  }
};

namespace {

enum class Flow { kNormal, kBreak, kContinue };

Value eval(const Expr& e, const ScopePtr& scope, Context& ctx);
Flow exec(const Body& body, const ScopePtr& scope, Context& ctx, std::string& out);

[[noreturn]] void undefined_error(const Value& u) {
  throw RenderError(u.as_string().empty() ? "an undefined value was used" : u.as_string());
}
void check_defined(const Value& v) {
  if (v.is_undefined()) undefined_error(v);
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
    case Value::Kind::kInt:
      return v.as_int() != 0;
    case Value::Kind::kFloat:
      return v.as_float() != 0;
    case Value::Kind::kString:
      return !v.as_string().empty();
    case Value::Kind::kList:
      return v.is_generator() || !v.as_list().empty();
    case Value::Kind::kDict:
      return !v.as_items().empty();
    default:
      return true;
  }
}

bool int_like(const Value& v) { return v.is_int() || v.is_bool(); }

bool py_eq(const Value& a, const Value& b, int depth = 0) {
  if (depth > kMaxNesting) throw RenderError("values nested too deeply to compare");
  if (a.is_number() && b.is_number()) {
    if (int_like(a) && int_like(b)) return a.as_int() == b.as_int();
    return a.as_float() == b.as_float();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      if (a.is_generator() || b.is_generator()) return &a.as_list() == &b.as_list();
      if (a.is_tuple() != b.is_tuple() || a.as_list().size() != b.as_list().size()) return false;
      for (size_t i = 0; i < a.as_list().size(); ++i)
        if (!py_eq(a.as_list()[i], b.as_list()[i], depth + 1)) return false;
      return true;
    }
    case Value::Kind::kDict: {
      if (a.as_items().size() != b.as_items().size()) return false;
      for (const auto& [k, v] : a.as_items()) {
        bool found = false;
        for (const auto& [k2, v2] : b.as_items()) {
          if (py_eq(k, k2, depth + 1)) {
            if (!py_eq(v, v2, depth + 1)) return false;
            found = true;
            break;
          }
        }
        if (!found) return false;
      }
      return true;
    }
    case Value::Kind::kNamespace:
      return &a.as_items() == &b.as_items();
    case Value::Kind::kFunction:
      return &a.as_function() == &b.as_function();
    default:
      return false;
  }
}

// Python's a < b; a TypeError for types Python does not order.
bool py_less(const Value& a, const Value& b, int depth = 0) {
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  if (depth > kMaxNesting) throw RenderError("values nested too deeply to compare");
  if (a.is_number() && b.is_number()) {
    if (int_like(a) && int_like(b)) return a.as_int() < b.as_int();
    return a.as_float() < b.as_float();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // code point order
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple() && !a.is_generator() &&
      !b.is_generator()) {
    const auto& x = a.as_list();
    const auto& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!py_eq(x[i], y[i], depth + 1)) return py_less(x[i], y[i], depth + 1);
    }
    return x.size() < y.size();
  }
  throw RenderError(fmt::format("'<' not supported between instances of '{}' and '{}'",
                                type_name(a), type_name(b)));
}

// The items a for loop, list() or a filter goes through.
std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kList:
      return v.as_list();
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& kv : v.as_items()) keys.push_back(kv.first);
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      std::string one;
      for (char32_t c : to_u32(v.as_string())) {
        one.clear();
        append_utf8(one, c);
        chars.emplace_back(one);
      }
      return chars;
    }
    default:
      throw RenderError(fmt::format("'{}' object is not iterable", type_name(v)));
  }
}

int64_t py_len(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return static_cast<int64_t>(cp_count(v.as_string()));
    case Value::Kind::kList:
      if (v.is_generator()) throw RenderError("object of type 'generator' has no len()");
      return static_cast<int64_t>(v.as_list().size());
    case Value::Kind::kDict:
      return static_cast<int64_t>(v.as_items().size());
    default:
      throw RenderError(fmt::format("object of type '{}' has no len()", type_name(v)));
  }
}

bool py_contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        throw RenderError(
            fmt::format("'in <string>' requires string as left operand, not {}", type_name(item)));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& x : container.as_list())
        if (py_eq(x, item)) return true;
      return false;
    case Value::Kind::kDict:
      for (const auto& kv : container.as_items())
        if (py_eq(kv.first, item)) return true;
      return false;
    default:
      throw RenderError(fmt::format("argument of type '{}' is not iterable", type_name(container)));
  }
}

// ---- call arguments ----

struct Params {
  std::vector<Value> values;
  std::vector<bool> given;
  bool has(size_t i) const { return given[i]; }
  const Value& operator[](size_t i) const { return values[i]; }
};

Params bind(const std::string& fname, CallArgs& a, std::initializer_list<const char*> names) {
  Params p;
  p.values.resize(names.size());
  p.given.assign(names.size(), false);
  if (a.positional.size() > names.size()) {
    throw RenderError(fmt::format("{}() takes at most {} argument(s) ({} given)", fname,
                                  names.size(), a.positional.size()));
  }
  for (size_t i = 0; i < a.positional.size(); ++i) {
    p.values[i] = a.positional[i];
    p.given[i] = true;
  }
  for (auto& [key, v] : a.keyword) {
    size_t i = 0;
    for (const char* n : names) {
      if (key == n) break;
      ++i;
    }
    if (i == names.size()) {
      throw RenderError(
          fmt::format("{}() got an unexpected keyword argument {}", fname, quoted(key)));
    }
    if (p.given[i]) {
      throw RenderError(
          fmt::format("{}() got multiple values for argument {}", fname, quoted(key)));
    }
    p.values[i] = v;
    p.given[i] = true;
  }
  return p;
}

const std::string& want_string(const Value& v, const std::string& what) {
  if (!v.is_string()) {
    check_defined(v);
    throw RenderError(fmt::format("{} must be a string, not {}", what, type_name(v)));
  }
  return v.as_string();
}
int64_t want_int(const Value& v, const std::string& what) {
  if (!int_like(v)) {
    check_defined(v);
    throw RenderError(fmt::format("{} must be an integer, not {}", what, type_name(v)));
  }
  return v.as_int();
}

// `holds`: the value a bound method keeps (its object).
Value make_function(std::string name, std::function<Value(Context&, CallArgs&)> fn,
                    const Value* holds = nullptr) {
  auto f = std::make_shared<Function>();
  f->name = std::move(name);
  f->call = std::move(fn);
  return Value::function(std::move(f), holds);
}

// ---- strings as Python's str ----

// Python's index normalisation: -1 is the last.
bool py_index(int64_t& i, int64_t n) {
  if (i < 0) i += n;
  return i >= 0 && i < n;
}

// Python's slice(start, stop, step).indices(n) and the positions it selects.
std::vector<int64_t> slice_positions(const Value& start, const Value& stop, const Value& step,
                                     int64_t n) {
  const auto opt = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    return want_int(v, std::string("a slice's ") + what);
  };
  const int64_t st = opt(step, "step").value_or(1);
  if (st == 0) throw RenderError("slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> x, int64_t def) {
    if (!x) return def;
    int64_t v = *x;
    if (v < 0) {
      v += n;
      if (v < 0) v = st < 0 ? -1 : 0;
    } else if (v >= n) {
      v = st < 0 ? n - 1 : n;
    }
    return v;
  };
  const int64_t lo = clamp(opt(start, "start"), st < 0 ? n - 1 : 0);
  const int64_t hi = clamp(opt(stop, "stop"), st < 0 ? -1 : n);
  std::vector<int64_t> pos;
  if (st > 0) {
    for (int64_t i = lo; i < hi; i += st) pos.push_back(i);
  } else {
    for (int64_t i = lo; i > hi; i += st) pos.push_back(i);
  }
  return pos;
}

std::vector<std::string> py_split(const std::string& s, const Value& sep, int64_t maxsplit,
                                  bool from_right) {
  std::vector<std::string> parts;
  if (sep.is_none() || sep.is_undefined()) {  // runs of whitespace; none at the ends
    const std::u32string u = to_u32(s);
    std::vector<std::pair<size_t, size_t>> words;
    for (size_t i = 0; i < u.size();) {
      while (i < u.size() && py_space(u[i])) ++i;
      if (i == u.size()) break;
      size_t j = i;
      while (j < u.size() && !py_space(u[j])) ++j;
      words.emplace_back(i, j);
      i = j;
    }
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit + 1) {
      // The unsplit rest keeps its inner whitespace (and loses it at its outer end only).
      if (!from_right) {
        const size_t rest = words[static_cast<size_t>(maxsplit)].first;
        words.resize(static_cast<size_t>(maxsplit));
        for (auto& w : words)
          parts.push_back(from_u32(std::u32string_view(u).substr(w.first, w.second - w.first)));
        size_t e = u.size();
        while (e > rest && py_space(u[e - 1])) --e;
        parts.push_back(from_u32(std::u32string_view(u).substr(rest, e - rest)));
        return parts;
      }
      const size_t keep = static_cast<size_t>(maxsplit);
      const size_t rest_end = words[words.size() - keep - 1].second;
      size_t b = 0;
      while (b < rest_end && py_space(u[b])) ++b;
      parts.push_back(from_u32(std::u32string_view(u).substr(b, rest_end - b)));
      for (size_t k = words.size() - keep; k < words.size(); ++k)
        parts.push_back(from_u32(
            std::u32string_view(u).substr(words[k].first, words[k].second - words[k].first)));
      return parts;
    }
    for (auto& w : words)
      parts.push_back(from_u32(std::u32string_view(u).substr(w.first, w.second - w.first)));
    return parts;
  }
  const std::string& d = want_string(sep, "split()'s separator");
  if (d.empty()) throw RenderError("empty separator");
  if (!from_right) {
    size_t start = 0;
    int64_t n = 0;
    while (maxsplit < 0 || n < maxsplit) {
      const size_t f = s.find(d, start);
      if (f == std::string::npos) break;
      parts.push_back(s.substr(start, f - start));
      start = f + d.size();
      ++n;
    }
    parts.push_back(s.substr(start));
    return parts;
  }
  size_t end = s.size();
  int64_t n = 0;
  while (maxsplit < 0 || n < maxsplit) {
    if (end < d.size()) break;
    const size_t f = s.rfind(d, end - d.size());
    if (f == std::string::npos) break;
    parts.push_back(s.substr(f + d.size(), end - f - d.size()));
    end = f;
    ++n;
  }
  parts.push_back(s.substr(0, end));
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  const std::u32string u = to_u32(s);
  std::u32string set;
  const bool ws = chars.is_none() || chars.is_undefined();
  if (!ws) set = to_u32(want_string(chars, "strip()'s characters"));
  const auto strip = [&](char32_t c) {
    return ws ? py_space(c) : set.find(c) != std::u32string::npos;
  };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip(u[b])) ++b;
  if (right)
    while (e > b && strip(u[e - 1])) --e;
  return from_u32(std::u32string_view(u).substr(b, e - b));
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl,
                       int64_t count) {
  std::string out;
  if (old.empty()) {
    const std::u32string u = to_u32(s);
    int64_t n = 0;
    for (size_t i = 0; i <= u.size(); ++i) {
      if (count < 0 || n < count) {
        out += repl;
        ++n;
      }
      if (i < u.size()) append_utf8(out, u[i]);
      check_size(out.size());
    }
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t f = s.find(old, start);
    if (f == std::string::npos) break;
    out.append(s, start, f - start);
    out += repl;
    check_size(out.size());
    start = f + old.size();
    ++n;
  }
  out.append(s, start);
  return out;
}

std::string py_title(const std::string& s) {
  std::u32string u = to_u32(s);
  bool prev_cased = false;
  for (char32_t& c : u) {
    const bool cased = py_cased(c);
    c = prev_cased ? py_lower(c) : py_title(c);
    prev_cased = cased;
  }
  return from_u32(u);
}

std::string py_capitalize(const std::string& s) {
  std::u32string u = to_u32(s);
  for (size_t i = 0; i < u.size(); ++i) u[i] = i == 0 ? py_title(u[i]) : py_lower(u[i]);
  return from_u32(u);
}

// The code point index of a byte offset.
int64_t cp_index(const std::string& s, size_t byte) {
  return static_cast<int64_t>(cp_count(std::string_view(s).substr(0, byte)));
}

Value str_method(Context& ctx, const std::string& s, const std::string& name, CallArgs& a);
Value dict_method(const Value& d, const std::string& name, CallArgs& a);

bool is_str_method(const std::string& n) {
  static const std::unordered_set<std::string> names = {
      "startswith",  "endswith",   "split",        "rsplit",       "strip",      "lstrip",
      "rstrip",      "lower",      "upper",        "title",        "capitalize", "replace",
      "count",       "find",       "rfind",        "index",        "rindex",     "join",
      "isdigit",     "isalpha",    "isalnum",      "isspace",      "islower",    "isupper",
      "isnumeric",   "isdecimal",  "removeprefix", "removesuffix", "splitlines", "swapcase",
      "casefold",    "zfill",      "center",       "ljust",        "rjust",      "format",
      "partition",   "rpartition", "encode",       "expandtabs",   "istitle",    "isidentifier",
      "isprintable", "isascii",    "maketrans",    "translate",    "format_map"};
  return names.count(n) != 0;
}

// The sandbox's getattr: an attribute of the object (a method), else its item, else Undefined.
Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) undefined_error(obj);
  const auto missing = [&] {
    return Value::undefined(
        fmt::format("{} has no attribute {}", quoted(object_type_repr(obj)), quoted(name)));
  };
  if (!name.empty() && name[0] == '_') {
    if (obj.is_dict() || obj.is_namespace())
      if (const Value* v = obj.find(name)) return *v;
    return Value::undefined(fmt::format("access to attribute {} of {} is unsafe", quoted(name),
                                        quoted(object_type_repr(obj))));
  }
  switch (obj.kind()) {
    case Value::Kind::kString:
      if (is_str_method(name)) {
        const std::string s = obj.as_string();
        return make_function("str." + name, [s, name](Context& ctx, CallArgs& a) {
          return str_method(ctx, s, name, a);
        });
      }
      return missing();
    case Value::Kind::kDict: {
      static const std::unordered_set<std::string> methods = {"items", "keys", "values", "get",
                                                              "copy"};
      static const std::unordered_set<std::string> mutating = {"pop",    "popitem", "setdefault",
                                                               "update", "clear",   "fromkeys"};
      if (methods.count(name) != 0) {
        return make_function(
            "dict." + name,
            [obj, name](Context&, CallArgs& a) { return dict_method(obj, name, a); }, &obj);
      }
      if (mutating.count(name) != 0) {
        throw RenderError(
            fmt::format("access to attribute {} of 'dict' object is unsafe", quoted(name)));
      }
      if (const Value* v = obj.find(name)) return *v;
      return missing();
    }
    case Value::Kind::kNamespace:
      if (const Value* v = obj.find(name)) return *v;
      return missing();
    case Value::Kind::kList: {
      static const std::unordered_set<std::string> mutating = {
          "append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse"};
      if (mutating.count(name) != 0) {
        throw RenderError(fmt::format("access to attribute {} of '{}' object is unsafe",
                                      quoted(name), type_name(obj)));
      }
      if (name == "index" || name == "count") {
        return make_function(
            std::string(type_name(obj)) + "." + name,
            [obj, name](Context&, CallArgs& a) {
              Params p = bind(name, a, {"value"});
              int64_t n = 0;
              for (size_t i = 0; i < obj.as_list().size(); ++i) {
                if (py_eq(obj.as_list()[i], p[0])) {
                  if (name == "index") return Value(static_cast<int64_t>(i));
                  ++n;
                }
              }
              if (name == "index") throw RenderError("list.index(x): x not in list");
              return Value(n);
            },
            &obj);
      }
      return missing();
    }
    default:
      return missing();
  }
}

// The sandbox's getitem: obj[key], else the attribute of a string key, else Undefined.
Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_error(obj);
  switch (obj.kind()) {
    case Value::Kind::kList:
      if (int_like(key) && !obj.is_generator()) {
        int64_t i = key.as_int();
        const int64_t n = static_cast<int64_t>(obj.as_list().size());
        if (py_index(i, n)) return obj.as_list()[static_cast<size_t>(i)];
        return Value::undefined(
            fmt::format("{} has no element {}", object_type_repr(obj), key.as_int()));
      }
      break;
    case Value::Kind::kString:
      if (int_like(key)) {
        const std::u32string u = to_u32(obj.as_string());
        int64_t i = key.as_int();
        if (py_index(i, static_cast<int64_t>(u.size()))) {
          std::string c;
          append_utf8(c, u[static_cast<size_t>(i)]);
          return Value(std::move(c));
        }
        return Value::undefined(fmt::format("str object has no element {}", key.as_int()));
      }
      break;
    case Value::Kind::kDict:
      for (const auto& [k, v] : obj.as_items())
        if (py_eq(k, key)) return v;
      break;
    default:
      break;
  }
  if (key.is_string()) return get_attr(obj, key.as_string());
  return Value::undefined(fmt::format("{} has no element {}", object_type_repr(obj), to_repr(key)));
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.is_list() && !obj.is_generator()) {
    std::vector<Value> out;
    for (int64_t i : slice_positions(start, stop, step, static_cast<int64_t>(obj.as_list().size())))
      out.push_back(obj.as_list()[static_cast<size_t>(i)]);
    return Value::list(std::move(out), obj.is_tuple());
  }
  if (obj.is_string()) {
    const std::u32string u = to_u32(obj.as_string());
    std::u32string out;
    for (int64_t i : slice_positions(start, stop, step, static_cast<int64_t>(u.size())))
      out.push_back(u[static_cast<size_t>(i)]);
    return Value(from_u32(out));
  }
  return Value::undefined(fmt::format("{} cannot be sliced", quoted(object_type_repr(obj))));
}

Value str_method(Context&, const std::string& s, const std::string& name, CallArgs& a) {
  const std::string fname = "str." + name;
  if (name == "startswith" || name == "endswith") {
    Params p = bind(fname, a, {"prefix", "start", "end"});
    if (p.has(1) || p.has(2)) throw RenderError(fname + "(): start and end are not supported");
    std::vector<std::string> options;
    if (p[0].is_list()) {
      for (const Value& v : p[0].as_list())
        options.push_back(want_string(v, fname + "()'s argument"));
    } else {
      options.push_back(want_string(p[0], fname + "()'s argument"));
    }
    for (const std::string& o : options) {
      if (name == "startswith"
              ? s.compare(0, o.size(), o) == 0 && s.size() >= o.size()
              : s.size() >= o.size() && s.compare(s.size() - o.size(), o.size(), o) == 0)
        return Value(true);
    }
    return Value(false);
  }
  if (name == "split" || name == "rsplit") {
    Params p = bind(fname, a, {"sep", "maxsplit"});
    const int64_t maxsplit = p.has(1) ? want_int(p[1], "maxsplit") : -1;
    std::vector<Value> out;
    for (auto& part : py_split(s, p[0], maxsplit, name == "rsplit"))
      out.emplace_back(std::move(part));
    return Value::list(std::move(out));
  }
  if (name == "splitlines") {
    Params p = bind(fname, a, {"keepends"});
    const bool keep = truthy(p[0]);
    std::vector<Value> out;
    const std::u32string u = to_u32(s);
    size_t start = 0;
    for (size_t i = 0; i < u.size(); ++i) {
      const char32_t c = u[i];
      const bool br = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
                      c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
      if (!br) continue;
      size_t e = i + 1;
      if (c == '\r' && e < u.size() && u[e] == '\n') ++e;
      out.emplace_back(from_u32(std::u32string_view(u).substr(start, (keep ? e : i) - start)));
      start = e;
      i = e - 1;
    }
    if (start < u.size()) out.emplace_back(from_u32(std::u32string_view(u).substr(start)));
    return Value::list(std::move(out));
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    Params p = bind(fname, a, {"chars"});
    return Value(py_strip(s, p[0], name != "rstrip", name != "lstrip"));
  }
  if (name == "lower" || name == "upper" || name == "title" || name == "capitalize" ||
      name == "swapcase" || name == "casefold") {
    bind(fname, a, {});
    if (name == "lower" || name == "casefold") return Value(map_chars(s, py_lower));
    if (name == "upper") return Value(map_chars(s, py_upper));
    if (name == "title") return Value(py_title(s));
    if (name == "capitalize") return Value(py_capitalize(s));
    return Value(map_chars(
        s, [](char32_t c) { return py_cased(c) && py_lower(c) == c ? py_upper(c) : py_lower(c); }));
  }
  if (name == "replace") {
    Params p = bind(fname, a, {"old", "new", "count"});
    return Value(py_replace(s, want_string(p[0], "replace()'s old"),
                            want_string(p[1], "replace()'s new"),
                            p.has(2) ? want_int(p[2], "replace()'s count") : -1));
  }
  if (name == "count" || name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    Params p = bind(fname, a, {"sub"});
    const std::string& sub = want_string(p[0], fname + "()'s argument");
    if (name == "count") {
      if (sub.empty()) return Value(static_cast<int64_t>(cp_count(s)) + 1);
      int64_t n = 0;
      for (size_t f = s.find(sub); f != std::string::npos; f = s.find(sub, f + sub.size())) ++n;
      return Value(n);
    }
    const size_t f = name == "find" || name == "index" ? s.find(sub) : s.rfind(sub);
    if (f == std::string::npos) {
      if (name == "index" || name == "rindex") throw RenderError("substring not found");
      return Value(int64_t{-1});
    }
    return Value(cp_index(s, f));
  }
  if (name == "join") {
    Params p = bind(fname, a, {"iterable"});
    std::string out;
    bool first = true;
    for (const Value& v : iterate(p[0])) {
      if (!first) out += s;
      first = false;
      out += want_string(v, "str.join()'s items");
      check_size(out.size());
    }
    return Value(std::move(out));
  }
  if (name.rfind("is", 0) == 0 && name != "isidentifier" && name != "istitle") {
    bind(fname, a, {});
    const std::u32string u = to_u32(s);
    if (name == "isascii")
      return Value(std::all_of(u.begin(), u.end(), [](char32_t c) { return c < 0x80; }));
    if (u.empty()) return Value(false);
    const auto cat = [](char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)); };
    const auto digit = [&](char32_t c) { return cat(c) == UTF8PROC_CATEGORY_ND; };
    const auto alpha = [&](char32_t c) {
      const auto k = cat(c);
      return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
             k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_LO;
    };
    if (name == "isdigit" || name == "isdecimal" || name == "isnumeric")
      return Value(std::all_of(u.begin(), u.end(), digit));
    if (name == "isalpha") return Value(std::all_of(u.begin(), u.end(), alpha));
    if (name == "isalnum")
      return Value(
          std::all_of(u.begin(), u.end(), [&](char32_t c) { return alpha(c) || digit(c); }));
    if (name == "isspace") return Value(std::all_of(u.begin(), u.end(), py_space));
    if (name == "isprintable") return Value(std::all_of(u.begin(), u.end(), py_printable));
    if (name == "islower" || name == "isupper") {
      bool any = false;
      for (char32_t c : u) {
        if (!py_cased(c)) continue;
        any = true;
        if (name == "islower" ? py_lower(c) != c : py_upper(c) != c) return Value(false);
      }
      return Value(any);
    }
  }
  if (name == "removeprefix" || name == "removesuffix") {
    Params p = bind(fname, a, {"affix"});
    const std::string& x = want_string(p[0], fname + "()'s argument");
    if (name == "removeprefix" && s.compare(0, x.size(), x) == 0 && s.size() >= x.size())
      return Value(s.substr(x.size()));
    if (name == "removesuffix" && s.size() >= x.size() &&
        s.compare(s.size() - x.size(), x.size(), x) == 0)
      return Value(s.substr(0, s.size() - x.size()));
    return Value(s);
  }
  if (name == "partition" || name == "rpartition") {
    Params p = bind(fname, a, {"sep"});
    const std::string& sep = want_string(p[0], fname + "()'s separator");
    if (sep.empty()) throw RenderError("empty separator");
    const size_t f = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (f == std::string::npos) {
      return name == "partition" ? Value::list({Value(s), Value(""), Value("")}, true)
                                 : Value::list({Value(""), Value(""), Value(s)}, true);
    }
    return Value::list({Value(s.substr(0, f)), Value(sep), Value(s.substr(f + sep.size()))}, true);
  }
  if (name == "format") {  // {} {0} {name} and {{ }}; no format specs or conversions
    std::string out;
    size_t auto_index = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '{' && i + 1 < s.size() && s[i + 1] == '{') {
        out += '{';
        ++i;
      } else if (s[i] == '}' && i + 1 < s.size() && s[i + 1] == '}') {
        out += '}';
        ++i;
      } else if (s[i] == '{') {
        const size_t close = s.find('}', i);
        if (close == std::string::npos) throw RenderError("str.format(): a '{' is not closed");
        const std::string field = s.substr(i + 1, close - i - 1);
        if (field.find_first_of(":!.[") != std::string::npos) {
          throw RenderError(
              fmt::format("str.format(): the field {} is outside the Jinja subset attn evaluates",
                          quoted(field)));
        }
        const Value* v = nullptr;
        if (field.empty() || std::all_of(field.begin(), field.end(), is_digit)) {
          size_t k = auto_index++;
          if (!field.empty()) std::from_chars(field.data(), field.data() + field.size(), k);
          if (k >= a.positional.size())
            throw RenderError(fmt::format("str.format(): no argument {}", k));
          v = &a.positional[k];
        } else {
          for (const auto& [key, x] : a.keyword)
            if (key == field) v = &x;
          if (v == nullptr)
            throw RenderError(fmt::format("str.format(): no argument {}", quoted(field)));
        }
        str_into(out, *v, 0);
        check_size(out.size());
        i = close;
      } else if (s[i] == '}') {
        throw RenderError("str.format(): Single '}' encountered in format string");
      } else {
        out += s[i];
      }
    }
    return Value(std::move(out));
  }
  throw RenderError(
      fmt::format("the method str.{}() is outside the Jinja subset attn evaluates", name));
}

Value dict_method(const Value& d, const std::string& name, CallArgs& a) {
  if (name == "get") {
    Params p = bind("dict.get", a, {"key", "default"});
    for (const auto& [k, v] : d.as_items())
      if (py_eq(k, p[0])) return v;
    return p.has(1) ? p[1] : Value::none();
  }
  bind("dict." + name, a, {});
  if (name == "copy") return Value::dict(d.as_items());
  std::vector<Value> out;
  for (const auto& [k, v] : d.as_items()) {
    if (name == "items")
      out.push_back(Value::list({k, v}, true));
    else
      out.push_back(name == "keys" ? k : v);
  }
  return Value::list(std::move(out));
}

}  // namespace

// ---- operators ----------------------------------------------------------------------------------

namespace {

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b) {
  throw RenderError(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op,
                                type_name(a), type_name(b)));
}

[[noreturn]] void overflow() {
  throw RenderError("integer overflow: the result does not fit in 64 bits");
}
int64_t add(int64_t x, int64_t y) {
  int64_t r = 0;
  if (__builtin_add_overflow(x, y, &r)) overflow();
  return r;
}
int64_t sub(int64_t x, int64_t y) {
  int64_t r = 0;
  if (__builtin_sub_overflow(x, y, &r)) overflow();
  return r;
}
int64_t mul(int64_t x, int64_t y) {
  int64_t r = 0;
  if (__builtin_mul_overflow(x, y, &r)) overflow();
  return r;
}

Value repeat(const Value& seq, int64_t times) {
  if (times <= 0) return seq.is_string() ? Value("") : Value::list({}, seq.is_tuple());
  if (seq.is_string()) {
    check_size(seq.as_string().size() *
               static_cast<size_t>(std::min<int64_t>(times, int64_t{1} << 40)));
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += seq.as_string();
    return seq.is_markup() ? Value::markup(std::move(out)) : Value(std::move(out));
  }
  check_size(seq.as_list().size() *
             static_cast<size_t>(std::min<int64_t>(times, int64_t{1} << 40)) * 8);
  std::vector<Value> out;
  for (int64_t i = 0; i < times; ++i)
    out.insert(out.end(), seq.as_list().begin(), seq.as_list().end());
  return Value::list(std::move(out), seq.is_tuple());
}

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  check_defined(a);
  check_defined(b);
  const bool nums = a.is_number() && b.is_number();
  const bool ints = int_like(a) && int_like(b);
  const int64_t x = a.as_int(), y = b.as_int();
  if (op == "+") {
    if (ints) return Value(add(x, y));
    if (nums) return Value(a.as_float() + b.as_float());
    if (a.is_string() && b.is_string()) {
      check_size(a.as_string().size() + b.as_string().size());
      // Markup + str escapes the str (markupsafe's __add__ and __radd__).
      if (a.is_markup() || b.is_markup()) {
        return Value::markup((a.is_markup() ? a.as_string() : html_escape(a.as_string())) +
                             (b.is_markup() ? b.as_string() : html_escape(b.as_string())));
      }
      return Value(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple() && !a.is_generator() &&
        !b.is_generator()) {
      std::vector<Value> out = a.as_list();
      out.insert(out.end(), b.as_list().begin(), b.as_list().end());
      return Value::list(std::move(out), a.is_tuple());
    }
  } else if (op == "-") {
    if (ints) return Value(sub(x, y));
    if (nums) return Value(a.as_float() - b.as_float());
  } else if (op == "*") {
    if (ints) return Value(mul(x, y));
    if (nums) return Value(a.as_float() * b.as_float());
    if ((a.is_string() || (a.is_list() && !a.is_generator())) && int_like(b)) return repeat(a, y);
    if ((b.is_string() || (b.is_list() && !b.is_generator())) && int_like(a)) return repeat(b, x);
  } else if (op == "/") {
    if (nums) {
      if (b.as_float() == 0) throw RenderError("division by zero");
      return Value(a.as_float() / b.as_float());
    }
  } else if (op == "//" || op == "%") {
    if (ints) {
      if (y == 0) throw RenderError("integer division or modulo by zero");
      if (x == std::numeric_limits<int64_t>::min() && y == -1) overflow();
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      return Value(op == "//" ? q : m);
    }
    if (nums) {
      const double fx = a.as_float(), fy = b.as_float();
      if (fy == 0) throw RenderError(op == "//" ? "float floor division by zero" : "float modulo");
      double m = std::fmod(fx, fy);
      if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
      return Value(op == "//" ? std::floor((fx - m) / fy + 0.5) : m);
    }
    if (op == "%" && a.is_string()) {
      throw RenderError("string formatting with % is outside the Jinja subset attn evaluates");
    }
  } else if (op == "**") {
    if (ints && y >= 0) {
      int64_t acc = 1;
      for (int64_t i = 0; i < y; ++i) {
        acc = mul(acc, x);
        if (acc == 0 || acc == 1) break;
        if (acc == -1) {
          acc = (y - i - 1) % 2 == 0 ? -1 : 1;
          break;
        }
      }
      return Value(acc);
    }
    if (nums) {
      if (a.as_float() == 0 && b.as_float() < 0)
        throw RenderError("0.0 cannot be raised to a negative power");
      return Value(std::pow(a.as_float(), b.as_float()));
    }
  }
  unsupported(op, a, b);
}

bool compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return py_eq(a, b);
  if (op == "!=") return !py_eq(a, b);
  if (op == "<") return py_less(a, b);
  if (op == ">") return py_less(b, a);
  if (op == "<=") return py_less(a, b) || py_eq(a, b);
  if (op == ">=") return py_less(b, a) || py_eq(a, b);
  if (op == "in") return py_contains(b, a);
  return !py_contains(b, a);  // not in
}

// ---- filters and tests ----

Value apply_filter(Context& ctx, const std::string& name, const Value& v, CallArgs& a);
bool apply_test(Context& ctx, const std::string& name, const Value& v, CallArgs& a);

// jinja2's make_attrgetter: "a.b.0" as successive getitem calls.
Value attribute_of(const Value& item, const Value& attribute) {
  if (int_like(attribute)) return get_item(item, attribute);
  const std::string& path = want_string(attribute, "attribute");
  Value v = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool number = !part.empty() && std::all_of(part.begin(), part.end(), is_digit);
    int64_t idx = 0;
    if (number) std::from_chars(part.data(), part.data() + part.size(), idx);
    v = number ? get_item(v, Value(idx)) : get_item(v, Value(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

Value lowered(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value(map_chars(v.as_string(), py_lower)) : v;
}

std::string tojson_filter(const Value& v, CallArgs& a) {
  Params p = bind("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonStyle st;
  if (p.has(1) && !p[1].is_none()) {
    st.indent = true;
    if (p[1].is_string()) {
      st.indent_text = p[1].as_string();
    } else {
      const int64_t n = want_int(p[1], "tojson's indent");
      st.indent_text = std::string(static_cast<size_t>(std::clamp<int64_t>(n, 0, 1024)), ' ');
    }
  }
  st.item_separator = st.indent ? "," : ", ";
  st.key_separator = ": ";
  if (p.has(2) && !p[2].is_none()) {
    if (!p[2].is_list() || p[2].as_list().size() != 2)
      throw RenderError("tojson's separators must be a pair of strings");
    st.item_separator = want_string(p[2].as_list()[0], "tojson's item separator");
    st.key_separator = want_string(p[2].as_list()[1], "tojson's key separator");
  }
  st.sort_keys = p.has(3) && truthy(p[3]);
  std::string out;
  json_into(out, v, st, 0);
  if (p.has(0) && truthy(p[0])) {  // ensure_ascii: \uXXXX (surrogate pairs above U+FFFF)
    std::string ascii;
    for (char32_t c : to_u32(out)) {
      if (c < 0x80) {
        ascii += static_cast<char>(c);
      } else if (c < 0x10000) {
        ascii += fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
      } else {
        const uint32_t u = static_cast<uint32_t>(c) - 0x10000;
        ascii += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (u >> 10), 0xDC00 + (u & 0x3FF));
      }
    }
    return ascii;
  }
  return out;
}

std::vector<Value> sorted_values(std::vector<Value> items, bool reverse, bool case_sensitive,
                                 const Value& attribute) {
  const auto key = [&](const Value& v) {
    return lowered(attribute.is_none() || attribute.is_undefined() ? v : attribute_of(v, attribute),
                   case_sensitive);
  };
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& v : items) keyed.emplace_back(key(v), v);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? py_less(y.first, x.first) : py_less(x.first, y.first);
  });
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return out;
}

// select/reject/selectattr/rejectattr: the items whose test (or truth) is `keep`.
Value select_items(Context& ctx, const Value& seq, CallArgs& a, bool by_attribute, bool keep) {
  if (by_attribute && a.positional.empty())
    throw RenderError("selectattr/rejectattr need an attribute");
  Value attribute;
  size_t first = 0;
  if (by_attribute) attribute = a.positional[first++];
  std::string test;
  if (a.positional.size() > first) test = want_string(a.positional[first++], "the test's name");
  if (!test.empty() && test_names().count(test) == 0)
    throw RenderError(fmt::format("No test named {}", quoted(test)));
  CallArgs rest;
  rest.positional.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(first),
                         a.positional.end());
  rest.keyword = a.keyword;
  std::vector<Value> out;
  if (!truthy(seq)) return Value::generator({});  // jinja2: `if seq:` before iterating
  for (const Value& item : iterate(seq)) {
    const Value x = by_attribute ? attribute_of(item, attribute) : item;
    CallArgs args = rest;
    const bool ok = test.empty() ? truthy(x) : apply_test(ctx, test, x, args);
    if (ok == keep) out.push_back(item);
  }
  return Value::generator(std::move(out));
}

Value apply_filter(Context& ctx, const std::string& name, const Value& v, CallArgs& a) {
  ctx.step();
  if (name == "default" || name == "d") {
    Params p = bind(name, a, {"default_value", "boolean"});
    const bool use = v.is_undefined() || (p.has(1) && truthy(p[1]) && !truthy(v));
    return use ? (p.has(0) ? p[0] : Value("")) : v;
  }
  if (name == "tojson") return Value(tojson_filter(v, a));
  if (name == "trim") {
    Params p = bind(name, a, {"chars"});
    std::string t = py_strip(to_str(v), p[0], true, true);
    return v.is_markup() ? Value::markup(std::move(t)) : Value(std::move(t));
  }
  if (name == "length" || name == "count") {
    bind(name, a, {});
    return Value(py_len(v));
  }
  if (name == "string") {
    bind(name, a, {});
    return v.is_markup() ? v : Value(to_str(v));
  }
  if (name == "safe") {
    bind(name, a, {});
    return v.is_markup() ? v : Value::markup(to_str(v));
  }
  if (name == "e" || name == "escape" || name == "forceescape") {
    bind(name, a, {});
    if (v.is_markup() && name != "forceescape") return v;
    return Value::markup(html_escape(to_str(v)));
  }
  if (name == "lower" || name == "upper" || name == "capitalize") {
    bind(name, a, {});
    const std::string s = to_str(v);
    std::string t = name == "lower"   ? map_chars(s, py_lower)
                    : name == "upper" ? map_chars(s, py_upper)
                                      : py_capitalize(s);
    return v.is_markup() ? Value::markup(std::move(t)) : Value(std::move(t));
  }
  if (name == "title") {  // jinja2's: each word's first character upper, the rest lower
    bind(name, a, {});
    std::u32string u = to_u32(to_str(v));
    bool start = true;
    for (char32_t& c : u) {
      const bool sep = c == '-' || py_space(c) || c == '(' || c == '{' || c == '[' || c == '<';
      if (sep) {
        start = true;
      } else {
        c = start ? py_upper(c) : py_lower(c);
        start = false;
      }
    }
    return Value(from_u32(u));
  }
  if (name == "replace") {
    Params p = bind(name, a, {"old", "new", "count"});
    return Value(py_replace(to_str(v), to_str(p[0]), to_str(p[1]),
                            p.has(2) && !p[2].is_none() ? want_int(p[2], "replace's count") : -1));
  }
  if (name == "first" || name == "last") {
    bind(name, a, {});
    if (v.is_undefined()) undefined_error(v);
    std::vector<Value> items = iterate(v);
    if (items.empty())
      return Value::undefined(fmt::format("No {} item, sequence was empty.", name));
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    Params p = bind(name, a, {"d", "attribute"});
    const std::string sep = p.has(0) ? to_str(p[0]) : "";
    std::string out;
    bool first = true;
    for (const Value& item : iterate(v)) {
      if (!first) out += sep;
      first = false;
      str_into(out, p.has(1) && !p[1].is_none() ? attribute_of(item, p[1]) : item, 0);
      check_size(out.size());
    }
    return Value(std::move(out));
  }
  if (name == "list") {
    bind(name, a, {});
    return Value::list(iterate(v));
  }
  if (name == "items") {
    bind(name, a, {});
    if (v.is_undefined()) return Value::generator({});
    if (!v.is_dict()) throw RenderError("Can only get item pairs from a mapping.");
    std::vector<Value> out;
    for (const auto& [k, x] : v.as_items()) out.push_back(Value::list({k, x}, true));
    return Value::generator(std::move(out));
  }
  if (name == "dictsort") {
    Params p = bind(name, a, {"case_sensitive", "by", "reverse"});
    if (!v.is_dict()) throw RenderError("dictsort: the value must be a mapping");
    const bool by_value = p.has(1) && to_str(p[1]) == "value";
    std::vector<Value> pairs;
    for (const auto& [k, x] : v.as_items()) pairs.push_back(Value::list({k, x}, true));
    return Value::list(sorted_values(std::move(pairs), p.has(2) && truthy(p[2]),
                                     p.has(0) && truthy(p[0]), Value(int64_t{by_value ? 1 : 0})));
  }
  if (name == "reverse") {
    bind(name, a, {});
    if (v.is_string()) {
      std::u32string u = to_u32(v.as_string());
      std::reverse(u.begin(), u.end());
      return Value(from_u32(u));
    }
    std::vector<Value> items = iterate(v);
    std::reverse(items.begin(), items.end());
    return v.is_generator() ? Value::list(std::move(items)) : Value::generator(std::move(items));
  }
  if (name == "sort") {
    Params p = bind(name, a, {"reverse", "case_sensitive", "attribute"});
    return Value::list(
        sorted_values(iterate(v), p.has(0) && truthy(p[0]), p.has(1) && truthy(p[1]), p[2]));
  }
  if (name == "unique") {
    Params p = bind(name, a, {"case_sensitive", "attribute"});
    std::vector<Value> out, seen;
    for (const Value& item : iterate(v)) {
      const Value key = lowered(p.has(1) && !p[1].is_none() ? attribute_of(item, p[1]) : item,
                                p.has(0) && truthy(p[0]));
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return py_eq(s, key); })) {
        seen.push_back(key);
        out.push_back(item);
      }
    }
    return Value::generator(std::move(out));
  }
  if (name == "min" || name == "max") {
    Params p = bind(name, a, {"case_sensitive", "attribute"});
    std::vector<Value> items = iterate(v);
    if (items.empty())
      return Value::undefined(fmt::format("No aggregated item, sequence was empty."));
    std::vector<Value> s = sorted_values(items, false, p.has(0) && truthy(p[0]), p[1]);
    return name == "min" ? s.front() : s.back();
  }
  if (name == "sum") {
    Params p = bind(name, a, {"attribute", "start"});
    Value total = p.has(1) ? p[1] : Value(int64_t{0});
    for (const Value& item : iterate(v))
      total = binary_op("+", total, p.has(0) && !p[0].is_none() ? attribute_of(item, p[0]) : item);
    return total;
  }
  if (name == "map") {
    std::vector<Value> out;
    if (!truthy(v)) return Value::generator({});  // jinja2: `if seq:` before iterating
    const Value* attr = nullptr;
    Value def;
    bool has_default = false;
    for (const auto& [k, x] : a.keyword) {
      if (k == "attribute") attr = &x;
      if (k == "default") {
        def = x;
        has_default = true;
      }
    }
    if (attr != nullptr) {
      for (const Value& item : iterate(v)) {
        Value x = attribute_of(item, *attr);
        out.push_back(x.is_undefined() && has_default ? def : x);
      }
      return Value::generator(std::move(out));
    }
    if (a.positional.empty()) throw RenderError("map needs a filter name or attribute=");
    const std::string filter = want_string(a.positional[0], "map's filter name");
    if (filter_names().count(filter) == 0)
      throw RenderError(fmt::format("No filter named {}", quoted(filter)));
    CallArgs rest;
    rest.positional.assign(a.positional.begin() + 1, a.positional.end());
    rest.keyword = a.keyword;
    for (const Value& item : iterate(v)) {
      CallArgs args = rest;
      out.push_back(apply_filter(ctx, filter, item, args));
    }
    return Value::generator(std::move(out));
  }
  if (name == "select" || name == "reject") return select_items(ctx, v, a, false, name == "select");
  if (name == "selectattr" || name == "rejectattr")
    return select_items(ctx, v, a, true, name == "selectattr");
  if (name == "attr") {
    Params p = bind(name, a, {"name"});
    return get_attr(v, want_string(p[0], "attr's name"));
  }
  if (name == "int") {
    Params p = bind(name, a, {"default", "base"});
    const Value def = p.has(0) ? p[0] : Value(int64_t{0});
    const int base = p.has(1) ? static_cast<int>(want_int(p[1], "int's base")) : 10;
    if (int_like(v)) return Value(v.as_int());
    if (v.is_float()) {
      const double d = std::trunc(v.as_float());
      if (!std::isfinite(d) || std::fabs(d) > 9.2e18) return def;
      return Value(static_cast<int64_t>(d));
    }
    if (v.is_string()) {
      const std::string s = py_strip(v.as_string(), Value::none(), true, true);
      int64_t i = 0;
      std::string digits;
      for (char c : s)
        if (c != '_') digits += c;
      const bool neg = !digits.empty() && digits[0] == '-';
      const size_t b = !digits.empty() && (digits[0] == '-' || digits[0] == '+') ? 1 : 0;
      if (base >= 2 && base <= 36) {
        const auto r = std::from_chars(digits.data() + b, digits.data() + digits.size(), i, base);
        if (r.ec == std::errc() && r.ptr == digits.data() + digits.size() && digits.size() > b)
          return Value(neg ? -i : i);
      }
      double d = 0;
      const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), d);
      if (r.ec == std::errc() && r.ptr == digits.data() + digits.size() && std::isfinite(d) &&
          std::fabs(d) < 9.2e18)
        return Value(static_cast<int64_t>(std::trunc(d)));
    }
    return def;
  }
  if (name == "float") {
    Params p = bind(name, a, {"default"});
    if (v.is_number()) return Value(v.as_float());
    if (v.is_string()) {
      const std::string s = py_strip(v.as_string(), Value::none(), true, true);
      double d = 0;
      const auto r = std::from_chars(s.data(), s.data() + s.size(), d);
      if (r.ec == std::errc() && r.ptr == s.data() + s.size() && !s.empty()) return Value(d);
    }
    return p.has(0) ? p[0] : Value(0.0);
  }
  if (name == "abs") {
    bind(name, a, {});
    if (int_like(v)) {
      if (v.as_int() == std::numeric_limits<int64_t>::min()) overflow();
      return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
    }
    if (v.is_float()) return Value(std::fabs(v.as_float()));
    check_defined(v);
    throw RenderError(fmt::format("bad operand type for abs(): '{}'", type_name(v)));
  }
  if (name == "round") {
    Params p = bind(name, a, {"precision", "method"});
    const int64_t precision = p.has(0) ? want_int(p[0], "round's precision") : 0;
    const std::string method = p.has(1) ? to_str(p[1]) : "common";
    if (!v.is_number()) {
      check_defined(v);
      throw RenderError(fmt::format("round: '{}' is not a number", type_name(v)));
    }
    if (int_like(v) && precision >= 0) return Value(v.as_int());
    const double scale =
        std::pow(10.0, static_cast<double>(std::clamp<int64_t>(precision, -300, 300)));
    const double x = v.as_float() * scale;
    double r = 0;
    if (method == "common")
      r = std::nearbyint(x);  // Python's round(): half to even
    else if (method == "ceil")
      r = std::ceil(x);
    else if (method == "floor")
      r = std::floor(x);
    else
      throw RenderError("round: method must be common, ceil or floor");
    return Value(r / scale);
  }
  if (name == "indent") {
    Params p = bind(name, a, {"width", "first", "blank"});
    const std::string ind =
        p.has(0) && p[0].is_string()
            ? p[0].as_string()
            : std::string(static_cast<size_t>(std::clamp<int64_t>(
                              p.has(0) ? want_int(p[0], "indent's width") : 4, 0, 1024)),
                          ' ');
    CallArgs none;
    Value lines_v = str_method(ctx, to_str(v) + "\n", "splitlines", none);
    const auto& lines = lines_v.as_list();
    std::string out;
    if (p.has(2) && truthy(p[2])) {
      for (size_t i = 0; i < lines.size(); ++i) out += (i ? "\n" + ind : "") + lines[i].as_string();
    } else {
      for (size_t i = 0; i < lines.size(); ++i) {
        if (i == 0) {
          out += lines[i].as_string();
        } else {
          out += "\n";
          if (!lines[i].as_string().empty()) out += ind;
          out += lines[i].as_string();
        }
        check_size(out.size());
      }
    }
    if (p.has(1) && truthy(p[1])) out = ind + out;
    return Value(std::move(out));
  }
  if (name == "wordcount") {
    bind(name, a, {});
    int64_t n = 0;
    bool in_word = false;
    for (char32_t c : to_u32(to_str(v))) {
      const auto k = utf8proc_category(static_cast<utf8proc_int32_t>(c));
      const bool w = c == '_' || (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
                     (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
      if (w && !in_word) ++n;
      in_word = w;
    }
    return Value(n);
  }
  if (jinja_builtin(name)) {
    throw RenderError(
        fmt::format("the filter {} is outside the Jinja subset attn evaluates", quoted(name)));
  }
  throw RenderError(fmt::format("No filter named {}", quoted(name)));
}

bool apply_test(Context& ctx, const std::string& name, const Value& v, CallArgs& a) {
  ctx.step();
  const auto arg = [&](const char* what) -> Value {
    Params p = bind(name, a, {what});
    return p[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
  if (name == "sequence") return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
  if (name == "callable") return v.is_function();
  if (name == "escaped") return false;
  if (name == "lower" || name == "upper") {
    const std::string s = to_str(v);
    bool any = false;
    for (char32_t c : to_u32(s)) {
      if (!py_cased(c)) continue;
      any = true;
      if (name == "lower" ? py_lower(c) != c : py_upper(c) != c) return false;
    }
    return any;
  }
  if (name == "even" || name == "odd") {
    const int64_t n = want_int(v, "the value of 'is " + name + "'");
    return (n % 2 == 0) == (name == "even");
  }
  if (name == "divisibleby") {
    const int64_t d = want_int(arg("num"), "divisibleby's argument");
    if (d == 0) throw RenderError("integer division or modulo by zero");
    return want_int(v, "the value of 'is divisibleby'") % d == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return py_eq(v, arg("other"));
  if (name == "ne" || name == "!=") return !py_eq(v, arg("other"));
  if (name == "lt" || name == "lessthan" || name == "<") return py_less(v, arg("other"));
  if (name == "le" || name == "<=") {
    const Value o = arg("other");
    return py_less(v, o) || py_eq(v, o);
  }
  if (name == "gt" || name == "greaterthan" || name == ">") return py_less(arg("other"), v);
  if (name == "ge" || name == ">=") {
    const Value o = arg("other");
    return py_less(o, v) || py_eq(v, o);
  }
  if (name == "in") return py_contains(arg("seq"), v);
  if (name == "sameas") {
    const Value o = arg("other");
    if (v.kind() != o.kind()) return false;
    if (v.is_none() || v.is_bool()) return py_eq(v, o);
    if (v.is_list()) return &v.as_list() == &o.as_list();
    if (v.is_dict() || v.is_namespace()) return &v.as_items() == &o.as_items();
    if (v.is_function()) return &v.as_function() == &o.as_function();
    return false;
  }
  if (name == "filter") return v.is_string() && filter_names().count(v.as_string()) != 0;
  if (name == "test") return v.is_string() && test_names().count(v.as_string()) != 0;
  throw RenderError(fmt::format("No test named {}", quoted(name)));
}

}  // namespace

// ---- statements and expressions ----------------------------------------------------------------

namespace {

const Value* lookup(const Scope* s, const std::string& name) {
  for (; s != nullptr; s = s->parent.get()) {
    const auto it = s->vars.find(name);
    if (it != s->vars.end()) return &it->second;
  }
  return nullptr;
}

Value call(Context& ctx, const Value& callee, CallArgs& args) {
  if (callee.is_function()) return callee.as_function().call(ctx, args);
  check_defined(callee);
  throw RenderError(fmt::format("'{}' object is not callable", type_name(callee)));
}

CallArgs eval_args(const Expr& e, size_t first, const ScopePtr& scope, Context& ctx) {
  CallArgs a;
  for (size_t i = first; i < e.args.size(); ++i)
    a.positional.push_back(eval(*e.args[i], scope, ctx));
  for (const auto& [k, x] : e.kwargs) a.keyword.emplace_back(k, eval(*x, scope, ctx));
  return a;
}

Value eval(const Expr& e, const ScopePtr& scope, Context& ctx) {
  ctx.step();
  ctx.line = e.line;
  switch (e.kind) {
    case Expr::Kind::kConst:
      return e.value;
    case Expr::Kind::kName: {
      if (const Value* v = lookup(scope.get(), e.name)) return *v;
      return Value::undefined(fmt::format("{} is undefined", quoted(e.name)));
    }
    case Expr::Kind::kAttr: {
      const Value obj = eval(*e.args[0], scope, ctx);
      ctx.line = e.line;
      return get_attr(obj, e.name);
    }
    case Expr::Kind::kItem: {
      const Value obj = eval(*e.args[0], scope, ctx);
      const Expr& key = *e.args[1];
      if (key.kind == Expr::Kind::kSlice) {
        const auto part = [&](size_t i) {
          return key.args[i] ? eval(*key.args[i], scope, ctx) : Value::none();
        };
        const Value start = part(0), stop = part(1), step = part(2);
        ctx.line = e.line;
        return get_slice(obj, start, stop, step);
      }
      const Value k = eval(key, scope, ctx);
      ctx.line = e.line;
      return get_item(obj, k);
    }
    case Expr::Kind::kSlice:
      throw RenderError("a slice outside a subscript");
    case Expr::Kind::kCall: {
      const Value callee = eval(*e.args[0], scope, ctx);
      CallArgs a = eval_args(e, 1, scope, ctx);
      ctx.line = e.line;
      return call(ctx, callee, a);
    }
    case Expr::Kind::kFilter: {
      const Value v = eval(*e.args[0], scope, ctx);
      CallArgs a = eval_args(e, 1, scope, ctx);
      ctx.line = e.line;
      return apply_filter(ctx, e.name, v, a);
    }
    case Expr::Kind::kTest: {
      const Value v = eval(*e.args[0], scope, ctx);
      CallArgs a = eval_args(e, 1, scope, ctx);
      ctx.line = e.line;
      return Value(apply_test(ctx, e.name, v, a));
    }
    case Expr::Kind::kNeg:
    case Expr::Kind::kPos: {
      const Value v = eval(*e.args[0], scope, ctx);
      check_defined(v);
      const bool neg = e.kind == Expr::Kind::kNeg;
      if (int_like(v)) {
        if (neg && v.as_int() == std::numeric_limits<int64_t>::min()) overflow();
        return Value(neg ? -v.as_int() : v.as_int());
      }
      if (v.is_float()) return Value(neg ? -v.as_float() : v.as_float());
      throw RenderError(
          fmt::format("bad operand type for unary {}: '{}'", neg ? '-' : '+', type_name(v)));
    }
    case Expr::Kind::kNot:
      return Value(!truthy(eval(*e.args[0], scope, ctx)));
    case Expr::Kind::kBinary: {
      const Value a = eval(*e.args[0], scope, ctx);
      const Value b = eval(*e.args[1], scope, ctx);
      ctx.line = e.line;
      return binary_op(e.name, a, b);
    }
    case Expr::Kind::kConcat: {
      std::string out;
      for (const auto& x : e.args) {
        str_into(out, eval(*x, scope, ctx), 0);
        check_size(out.size());
      }
      return Value(std::move(out));
    }
    case Expr::Kind::kCompare: {
      Value left = eval(*e.args[0], scope, ctx);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = eval(*e.args[i + 1], scope, ctx);
        ctx.line = e.line;
        if (!compare(e.ops[i], left, right)) return Value(false);
        left = std::move(right);
      }
      return Value(true);
    }
    case Expr::Kind::kAnd: {
      Value a = eval(*e.args[0], scope, ctx);
      return truthy(a) ? eval(*e.args[1], scope, ctx) : a;
    }
    case Expr::Kind::kOr: {
      Value a = eval(*e.args[0], scope, ctx);
      return truthy(a) ? a : eval(*e.args[1], scope, ctx);
    }
    case Expr::Kind::kCond: {
      if (truthy(eval(*e.args[1], scope, ctx))) return eval(*e.args[0], scope, ctx);
      if (e.args.size() > 2) return eval(*e.args[2], scope, ctx);
      return Value::undefined(fmt::format(
          "the inline if-expression on line {} evaluated to false and no else section was defined.",
          e.line));
    }
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      std::vector<Value> items;
      for (const auto& x : e.args) items.push_back(eval(*x, scope, ctx));
      return Value::list(std::move(items), e.kind == Expr::Kind::kTuple);
    }
    case Expr::Kind::kDict: {
      Value::Items items;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        Value k = eval(*e.args[i], scope, ctx);
        Value v = eval(*e.args[i + 1], scope, ctx);
        if (k.is_list() && !k.is_tuple()) throw RenderError("unhashable type: 'list'");
        if (k.is_dict() || k.is_undefined())
          throw RenderError(fmt::format("unhashable type: '{}'", type_name(k)));
        auto it = std::find_if(items.begin(), items.end(),
                               [&](const auto& kv) { return py_eq(kv.first, k); });
        if (it != items.end()) {
          it->second = std::move(v);
        } else {
          items.emplace_back(std::move(k), std::move(v));
        }
      }
      return Value::dict(std::move(items));
    }
  }
  throw RenderError("an expression of an unknown kind");
}

void set_namespace_item(const Value& ns, const std::string& key, Value v) {
  if (!key.empty() && key[0] == '_') {
    throw RenderError(fmt::format(
        "Chat templates cannot store underscore-prefixed attributes on a namespace, but got {}",
        quoted(key)));
  }
  if (v.holds_namespace() || v.is_namespace()) {
    throw RenderError("a namespace holding a namespace is outside the Jinja subset attn evaluates");
  }
  // The namespace keeps the depth it was made with plus what it takes now.
  if (v.depth() + 1 > kMaxNesting) {
    throw RenderError(fmt::format("a value nested more than {} levels deep", kMaxNesting));
  }
  for (auto& [k, x] : ns.namespace_items()) {
    if (k.is_string() && k.as_string() == key) {
      x = std::move(v);
      return;
    }
  }
  ns.namespace_items().emplace_back(Value(key), std::move(v));
}

void assign(Scope& scope, const Stmt& s, const Value& v) {
  if (!s.unpack) {
    scope.vars[s.targets[0]] = v;
    return;
  }
  const std::vector<Value> items = iterate(v);
  if (items.size() != s.targets.size()) {
    throw RenderError(items.size() > s.targets.size()
                          ? fmt::format("too many values to unpack (expected {})", s.targets.size())
                          : fmt::format("not enough values to unpack (expected {}, got {})",
                                        s.targets.size(), items.size()));
  }
  for (size_t i = 0; i < items.size(); ++i) scope.vars[s.targets[i]] = items[i];
}

Value apply_filter_chain(const std::vector<ExprPtr>& filters, Value v, const ScopePtr& scope,
                         Context& ctx) {
  for (const auto& f : filters) {
    CallArgs a = eval_args(*f, 1, scope, ctx);
    ctx.line = f->line;
    v = apply_filter(ctx, f->name, v, a);
  }
  return v;
}

Value call_macro(const Stmt& m, const ScopePtr& defining, Context& ctx, CallArgs& a) {
  if (ctx.macro_depth >= kMaxMacroDepth) {
    throw RenderError(fmt::format("macro calls nested more than {} deep", kMaxMacroDepth));
  }
  auto scope = std::make_shared<Scope>();
  scope->parent = defining;
  std::vector<std::pair<std::string, Value>> kwargs = a.keyword;
  for (size_t i = 0; i < m.params.size(); ++i) {
    const std::string& pname = m.params[i].first;
    const ExprPtr& def = m.params[i].second;
    auto it = std::find_if(kwargs.begin(), kwargs.end(),
                           [&](const auto& kv) { return kv.first == pname; });
    if (i < a.positional.size()) {
      if (it != kwargs.end()) {
        throw RenderError(fmt::format("macro {} got multiple values for argument {}",
                                      quoted(m.text), quoted(pname)));
      }
      scope->vars[pname] = a.positional[i];
    } else if (it != kwargs.end()) {
      scope->vars[pname] = it->second;
      kwargs.erase(it);
    } else if (def) {
      scope->vars[pname] = eval(*def, scope, ctx);
    } else {
      scope->vars[pname] =
          Value::undefined(fmt::format("parameter {} was not provided", quoted(pname)));
    }
  }
  std::vector<Value> extra;
  for (size_t i = m.params.size(); i < a.positional.size(); ++i) extra.push_back(a.positional[i]);
  scope->vars["varargs"] = Value::list(std::move(extra), true);
  Value::Items kw;
  for (auto& [k, x] : kwargs) kw.emplace_back(Value(k), x);
  scope->vars["kwargs"] = Value::dict(std::move(kw));
  struct Depth {
    explicit Depth(Context& c) : ctx(c) { ++ctx.macro_depth; }
    ~Depth() { --ctx.macro_depth; }
    Context& ctx;
  } depth(ctx);
  std::string out;
  exec(m.body, scope, ctx, out);
  return Value(std::move(out));
}

Flow exec_for(const Stmt& s, const ScopePtr& scope, Context& ctx, std::string& out) {
  std::vector<Value> items = iterate(eval(*s.expr, scope, ctx));
  if (s.cond) {
    std::vector<Value> kept;
    for (Value& item : items) {
      auto fs = std::make_shared<Scope>();
      fs->parent = scope;
      ctx.line = s.line;
      assign(*fs, s, item);
      if (truthy(eval(*s.cond, fs, ctx))) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t k = 0; k < n; ++k) {
    ctx.step();
    auto ls = std::make_shared<Scope>();
    ls->parent = scope;
    ctx.line = s.line;
    const size_t i = static_cast<size_t>(k);
    assign(*ls, s, items[i]);
    const auto cycle = make_function("loop.cycle", [k](Context&, CallArgs& a) {
      if (a.positional.empty()) throw RenderError("no items for cycling given");
      return a.positional[static_cast<size_t>(k) % a.positional.size()];
    });
    const Value none_item = Value::undefined("there is no previous or next item");
    ls->vars["loop"] = Value::dict({
        {Value("index"), Value(k + 1)},
        {Value("index0"), Value(k)},
        {Value("revindex"), Value(n - k)},
        {Value("revindex0"), Value(n - k - 1)},
        {Value("first"), Value(k == 0)},
        {Value("last"), Value(k == n - 1)},
        {Value("length"), Value(n)},
        {Value("depth"), Value(int64_t{1})},
        {Value("depth0"), Value(int64_t{0})},
        {Value("previtem"), k > 0 ? items[i - 1] : none_item},
        {Value("nextitem"), k + 1 < n ? items[i + 1] : none_item},
        {Value("cycle"), cycle},
    });
    if (exec(s.body, ls, ctx, out) == Flow::kBreak) break;
  }
  if (n == 0 && !s.else_body.empty()) {
    auto es = std::make_shared<Scope>();
    es->parent = scope;
    return exec(s.else_body, es, ctx, out);  // a break there is an outer loop's
  }
  return Flow::kNormal;
}

Flow exec(const Body& body, const ScopePtr& scope, Context& ctx, std::string& out) {
  for (const auto& sp : body) {
    const Stmt& s = *sp;
    ctx.step();
    ctx.line = s.line;
    switch (s.kind) {
      case Stmt::Kind::kData:
        out += s.text;
        check_size(out.size());
        break;
      case Stmt::Kind::kPrint: {
        const Value v = eval(*s.expr, scope, ctx);
        str_into(out, v, 0);
        check_size(out.size());
        break;
      }
      case Stmt::Kind::kIf: {
        const Body* chosen = &s.else_body;
        for (const auto& [cond, b] : s.branches) {
          if (truthy(eval(*cond, scope, ctx))) {
            chosen = &b;
            break;
          }
        }
        if (const Flow f = exec(*chosen, scope, ctx, out); f != Flow::kNormal) return f;
        break;
      }
      case Stmt::Kind::kFor:
        if (const Flow f = exec_for(s, scope, ctx, out); f != Flow::kNormal) return f;
        break;
      case Stmt::Kind::kSet: {
        Value v = eval(*s.expr, scope, ctx);
        ctx.line = s.line;
        if (!s.text.empty()) {  // ns.attr = value
          const Value* ns = lookup(scope.get(), s.targets[0]);
          if (ns == nullptr)
            throw RenderError(fmt::format("{} is undefined", quoted(s.targets[0])));
          if (!ns->is_namespace())
            throw RenderError("cannot assign attribute on non-namespace object");
          set_namespace_item(*ns, s.text, std::move(v));
        } else {
          assign(*scope, s, v);
        }
        break;
      }
      case Stmt::Kind::kSetBlock: {
        std::string buf;
        exec(s.body, scope, ctx, buf);
        assign(*scope, s, apply_filter_chain(s.filters, Value(std::move(buf)), scope, ctx));
        break;
      }
      case Stmt::Kind::kMacro: {
        const Stmt* m = &s;
        // The macro refers to the scope it was defined in weakly: that scope holds the
        // macro (which may call itself through it).
        std::weak_ptr<Scope> home = scope;
        scope->vars[s.text] = make_function(s.text, [m, home](Context& c, CallArgs& a) {
          const ScopePtr defining = home.lock();
          if (!defining) throw RenderError("a macro called after its scope ended");
          return call_macro(*m, defining, c, a);
        });
        break;
      }
      case Stmt::Kind::kWith: {
        auto ws = std::make_shared<Scope>();
        ws->parent = scope;
        for (const auto& [name, e] : s.params) ws->vars[name] = eval(*e, scope, ctx);
        if (const Flow f = exec(s.body, ws, ctx, out); f != Flow::kNormal) return f;
        break;
      }
      case Stmt::Kind::kFilterBlock: {
        std::string buf;
        exec(s.body, scope, ctx, buf);
        str_into(out, apply_filter_chain(s.filters, Value(std::move(buf)), scope, ctx), 0);
        check_size(out.size());
        break;
      }
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
      case Stmt::Kind::kBody:
        if (const Flow f = exec(s.body, scope, ctx, out); f != Flow::kNormal) return f;
        break;
    }
  }
  return Flow::kNormal;
}

// ---- the globals ----

Value::Items keyword_items(CallArgs& a, const char* fname) {
  Value::Items items;
  if (a.positional.size() > 1)
    throw RenderError(fmt::format("{}() takes at most 1 positional argument", fname));
  if (a.positional.size() == 1) {
    const Value& m = a.positional[0];
    if (m.is_dict() || m.is_namespace()) {
      items = m.as_items();
    } else {
      for (const Value& pair : iterate(m)) {
        if (!pair.is_list() || pair.as_list().size() != 2)
          throw RenderError(fmt::format("{}(): each item must be a pair", fname));
        items.emplace_back(pair.as_list()[0], pair.as_list()[1]);
      }
    }
  }
  for (auto& [key, v] : a.keyword) {
    const std::string& k = key;  // (clang before 16 cannot capture a structured binding)
    auto it = std::find_if(items.begin(), items.end(), [&](const auto& kv) {
      return kv.first.is_string() && kv.first.as_string() == k;
    });
    if (it != items.end()) {
      it->second = v;
    } else {
      items.emplace_back(Value(k), v);
    }
  }
  return items;
}

ScopePtr make_globals() {
  auto g = std::make_shared<Scope>();
  g->vars["range"] = make_function("range", [](Context&, CallArgs& a) {
    if (!a.keyword.empty()) throw RenderError("range() takes no keyword arguments");
    if (a.positional.empty() || a.positional.size() > 3)
      throw RenderError(
          fmt::format("range expected 1 to 3 arguments, got {}", a.positional.size()));
    int64_t start = 0, stop = 0, step = 1;
    if (a.positional.size() == 1) {
      stop = want_int(a.positional[0], "range()'s argument");
    } else {
      start = want_int(a.positional[0], "range()'s start");
      stop = want_int(a.positional[1], "range()'s stop");
      if (a.positional.size() == 3) step = want_int(a.positional[2], "range()'s step");
    }
    if (step == 0) throw RenderError("range() arg 3 must not be zero");
    const double count =
        std::max(0.0, std::ceil((static_cast<double>(stop) - static_cast<double>(start)) /
                                static_cast<double>(step)));
    if (count > static_cast<double>(kMaxRange)) {
      throw RenderError(fmt::format(
          "Range too big. The sandbox blocks ranges larger than MAX_RANGE ({}).", kMaxRange));
    }
    std::vector<Value> out;
    for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) out.emplace_back(start + i * step);
    return Value::list(std::move(out));
  });
  g->vars["namespace"] = make_function("namespace", [](Context&, CallArgs& a) {
    Value::Items items = keyword_items(a, "namespace");
    for (const auto& kv : items) {
      if (kv.first.is_string() && !kv.first.as_string().empty() && kv.first.as_string()[0] == '_') {
        throw RenderError(fmt::format(
            "Chat templates cannot store underscore-prefixed attributes on a namespace, but got {}",
            quoted(kv.first.as_string())));
      }
    }
    return Value::name_space(std::move(items));
  });
  g->vars["dict"] = make_function(
      "dict", [](Context&, CallArgs& a) { return Value::dict(keyword_items(a, "dict")); });
  g->vars["raise_exception"] = make_function("raise_exception", [](Context&, CallArgs& a) -> Value {
    Params p = bind("raise_exception", a, {"message"});
    throw RenderError("the template raised an exception: " + to_str(p[0]));
  });
  g->vars["strftime_now"] = make_function("strftime_now", [](Context&, CallArgs& a) {
    Params p = bind("strftime_now", a, {"format"});
    const std::string& format = want_string(p[0], "strftime_now()'s format");
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    std::string buf(256 + 4 * format.size(), '\0');
    const size_t n =
        format.empty() ? 0 : std::strftime(buf.data(), buf.size(), format.c_str(), &local);
    if (n == 0 && !format.empty()) throw RenderError("strftime_now(): the format gives no text");
    buf.resize(n);
    return Value(std::move(buf));
  });
  return g;
}

}  // namespace

// ---- Template -----------------------------------------------------------------------------------

struct Template::Impl {
  std::string name;
  Body body;
};

Template::Template(std::string_view source, std::string name) {
  auto impl = std::make_shared<Impl>();
  impl->name = std::move(name);
  for (size_t i = 0; i < source.size();) {
    char32_t cp = 0;
    const char* why = nullptr;
    const size_t n = utf8_sequence(source, i, cp, &why);
    if (n == 0) {
      throw std::invalid_argument(
          fmt::format("{}: the source is not valid UTF-8 at byte {}: {}", impl->name, i, why));
    }
    i += n;
  }
  try {
    impl->body = Parser(Lexer(source).run()).parse_template();
  } catch (const SyntaxError& e) {
    throw std::invalid_argument(fmt::format("{} line {}: {}", impl->name, e.line, e.what()));
  }
  impl_ = std::move(impl);
}

std::string Template::render(const Value& variables) const {
  if (!variables.is_dict())
    throw std::invalid_argument("Template::render: the variables must be a dict");
  Context ctx;
  auto vars = std::make_shared<Scope>();
  vars->parent = make_globals();
  for (const auto& [k, v] : variables.as_items()) {
    if (!k.is_string())
      throw std::invalid_argument("Template::render: a variable's name must be a string");
    vars->vars[k.as_string()] = v;
  }
  auto root = std::make_shared<Scope>();
  root->parent = vars;
  std::string out;
  try {
    exec(impl_->body, root, ctx, out);
  } catch (const RenderError& e) {
    throw std::runtime_error(
        fmt::format("{} line {}: {}", impl_->name, ctx.line, printable(e.what(), 1024)));
  }
  return out;
}

}  // namespace attn::text::jinja
