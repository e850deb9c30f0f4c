#pragma once
// A gtest parameter name from a string parameter such as "tiny-mixtral" or "ekva-quota": test
// names take letters, digits and underscores only.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

namespace ekva::testing {

inline std::string param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

}  // namespace ekva::testing
