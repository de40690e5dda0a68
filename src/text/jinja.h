// jinja.h - a Jinja2 interpreter for chat templates: the subset of the
// language that the chat templates of today's open models use, evaluated as
// Python's jinja2 3.1 evaluates them in the environment transformers renders
// chat templates with (transformers/utils/chat_template_utils.py):
//
//   ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
//                                 extensions=[loopcontrols, {% generation %}])
//   globals raise_exception(msg), strftime_now(fmt), namespace(...), dict(...),
//   range(...) (at most 100000 items, as the sandbox's), and the filter
//   tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False)
//   as json.dumps writes.
//
// Source: text, {{ expr }}, {% statement %}, {# comment #}, each with `-` /
// `+` whitespace control, trim_blocks and lstrip_blocks as jinja2's lexer
// applies them, {% raw %}. Statements: if/elif/else, for (tuple targets, an
// `if` filter, else, the loop object, break/continue), set (a name, names,
// ns.attr, a block set with filters), macro (defaults, varargs, kwargs),
// with, filter blocks, generation. Expressions: literals (strings with
// Python's escapes, ints, floats, true/false/none in both cases, lists,
// tuples, dicts), names, attributes and subscripts (an attribute falls back to
// the item and the item to the attribute, as the sandbox's getattr/getitem),
// slices, calls with keyword arguments, filters, tests, `in`, comparisons,
// and/or/not, + - * / // % ** ~, conditional expressions; Python's str, dict
// and list methods that do not mutate. Values are Python's: str (code points:
// length, index and slices count characters), int (64-bit: an overflow is an
// error, not a big int), float (printed as repr prints it), bool, None, list,
// tuple, dict (insertion order), jinja2's default Undefined (prints as '',
// iterates as empty, an error when an attribute of it is read or it is added).
//
// Refused, with the tag or name in the message: extends, block, include,
// import, from, call blocks, do, recursive loops, filters and tests outside the
// list in jinja.cpp, anything the sandbox refuses (attributes starting with
// '_', list and dict methods that mutate), and a namespace stored in a
// namespace (no chains or cycles of namespaces: every value stays shallow).
// Errors: a syntax error is std::invalid_argument, an error while rendering
// (raise_exception, an undefined value used, a type error)
// std::runtime_error; both messages start "NAME line N: ". Work is bounded for
// any template (nesting depth of source and values, macro recursion, steps,
// output size), so a hostile template ends in an error.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace attn::text::jinja {

class Value;
struct Function;

// A Python value as a template sees it. Lists and dicts are shared, as Python
// shares them; only namespace() objects are changed after they are made.
class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,  // a list, or a tuple when tuple is set
    kDict,
    kNamespace,  // namespace(): a dict whose entries are attributes
    kFunction,
  };
  using Items = std::vector<std::pair<Value, Value>>;  // a dict's (key, value) in insertion order

  Value() = default;  // Undefined
  static Value undefined(std::string hint) {
    Value v;
    v.str_ = std::move(hint);
    return v;
  }
  static Value none() { return Value(Kind::kNone); }
  explicit Value(bool b) : kind_(Kind::kBool), int_(b ? 1 : 0) {}
  explicit Value(int64_t i) : kind_(Kind::kInt), int_(i) {}
  explicit Value(double f) : kind_(Kind::kFloat), float_(f) {}
  explicit Value(std::string s) : kind_(Kind::kString), str_(std::move(s)) {}
  explicit Value(const char* s) : Value(std::string(s)) {}
  static Value list(std::vector<Value> items, bool tuple = false);
  // What jinja2's map, select, reject, selectattr, rejectattr, unique, items
  // and reverse (of a list) return: a one-shot iterator, always true, with no
  // len(), no items by index and no JSON form (attn keeps its items; Python
  // would give them once).
  static Value generator(std::vector<Value> items);
  // A string marked safe (jinja2's Markup, from |safe and |escape): a plain
  // string added to it is HTML-escaped first.
  static Value markup(std::string s);
  static Value dict(Items items);
  static Value name_space(Items items);
  // `holds` is a value the function keeps (a bound method's object).
  static Value function(std::shared_ptr<const Function> fn, const Value* holds = nullptr);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }  // not a bool (Python's bool is an int too)
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return is_bool() || is_int() || is_float(); }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }  // list or tuple
  bool is_tuple() const { return kind_ == Kind::kList && tuple_; }
  bool is_generator() const { return kind_ == Kind::kList && lazy_; }
  bool is_markup() const { return kind_ == Kind::kString && lazy_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_function() const { return kind_ == Kind::kFunction; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return int_; }  // a bool's or an int's value
  double as_float() const { return is_float() ? float_ : static_cast<double>(int_); }
  const std::string& as_string() const { return str_; }  // a string; an Undefined's hint
  const std::vector<Value>& as_list() const { return *list_; }
  const Items& as_items() const { return *items_; }  // a dict's or a namespace's entries
  Items& namespace_items() const { return *items_; }
  const Function& as_function() const { return *fn_; }

  // How deep the lists, dicts and namespaces nest (0 for a scalar), as it was
  // when the value was made, and whether a namespace is inside: a namespace
  // takes no value holding a namespace, so no chain or cycle of namespaces
  // can be built and every value stays shallow (at most kMaxNesting levels,
  // checked as values are made, so freeing one never recurses deeply).
  int depth() const { return depth_; }
  bool holds_namespace() const { return holds_ns_; }

  // The dict entry of a string key, or nullptr.
  const Value* find(std::string_view key) const;

 private:
  explicit Value(Kind k) : kind_(k) {}
  Kind kind_ = Kind::kUndefined;
  bool tuple_ = false;
  bool lazy_ = false;  // a list: a generator; a string: Markup
  bool holds_ns_ = false;
  int depth_ = 0;
  void nest(const Value& child);  // depth and holds_ns_ over a child
  int64_t int_ = 0;
  double float_ = 0;
  std::string str_;
  std::shared_ptr<const std::vector<Value>> list_;
  std::shared_ptr<Items> items_;
  std::shared_ptr<const Function> fn_;
};

// Python's str(v) (what {{ v }} prints; Undefined prints as '') and repr(v).
std::string to_str(const Value& v);
std::string to_repr(const Value& v);
// json.dumps(v, ensure_ascii=False, indent, separators, sort_keys); indent < 0
// is None. Throws std::runtime_error for a value JSON has no form of.
std::string to_json(const Value& v, int indent = -1, std::string_view item_separator = ", ",
                    std::string_view key_separator = ": ", bool sort_keys = false);

class Template {
 public:
  // Parses source; `name` stands for it in messages ("chat template").
  // Throws std::invalid_argument("NAME line N: ...") for a syntax error or a
  // construct outside the subset.
  explicit Template(std::string_view source, std::string name = "template");
  // The text the template renders with these variables (a dict whose keys are
  // strings). Throws std::runtime_error("NAME line N: ...").
  std::string render(const Value& variables) const;

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace attn::text::jinja
