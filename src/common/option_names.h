// The names of the operators' enum options, defined once for every front end: the CLI
// (`--convention roll`) and the Python bindings (`convention="roll"`) parse them here, so
// the spellings, the aliases and the error message cannot drift apart.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "subquad/cat.h"
#include "subquad/circulant2d.h"
#include "subquad/error.h"
#include "subquad/wildcat.h"

namespace subquad {

template <typename Enum>
struct OptionName {
  const char* text;
  Enum value;
};

inline constexpr OptionName<CatConvention> kCatConventionNames[] = {
    {"roll", CatConvention::roll}, {"conv", CatConvention::conv}};
inline constexpr OptionName<CatPath> kCatPathNames[] = {
    {"automatic", CatPath::automatic}, {"direct", CatPath::direct}, {"fft", CatPath::fft}};
inline constexpr OptionName<Circulant2dScaleMode> kCirculant2dScaleModeNames[] = {
    {"paper", Circulant2dScaleMode::paper}, {"code", Circulant2dScaleMode::code}};
// The CLI's method names first; the Python spellings with "_" are accepted too.
inline constexpr OptionName<CoresetMethod> kCoresetMethodNames[] = {
    {"wildcat", CoresetMethod::wildcat},
    {"uniform-nystrom", CoresetMethod::uniform_nystrom},
    {"uniform-subsample", CoresetMethod::uniform_subsample},
    {"uniform_nystrom", CoresetMethod::uniform_nystrom},
    {"uniform_subsample", CoresetMethod::uniform_subsample}};
inline constexpr OptionName<QueryRadius> kQueryRadiusNames[] = {{"keys", QueryRadius::keys},
                                                                {"queries", QueryRadius::queries}};

// "a|b|c": the choices, for help texts and errors.
template <typename Enum, size_t Count>
std::string option_choices(const OptionName<Enum> (&names)[Count]) {
  std::string choices;
  for (const OptionName<Enum>& name : names) {
    if (!choices.empty()) choices += '|';
    choices += name.text;
  }
  return choices;
}

// The value named `text`, or an Error naming `argument` and the choices.
template <typename Enum, size_t Count>
Enum parse_option(std::string_view text, const char* argument,
                  const OptionName<Enum> (&names)[Count]) {
  for (const OptionName<Enum>& name : names)
    if (text == name.text) return name.value;
  throw_error(argument, ": expected one of ", option_choices(names), ", got \"", std::string(text),
              "\"");
}

}  // namespace subquad
