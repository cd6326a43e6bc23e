// The real model and text of ../shared, loaded once per test process, for the end-to-end
// suites.
#pragma once

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kvstack/check.h"
#include "kvstack/model.h"

namespace kvstack::e2e {

inline const std::string kSharedDir = KVS_SHARED_DIR;
inline const std::string kModelPath = kSharedDir + "/models/stories260K.gguf";
inline const std::string kTextPath = kSharedDir + "/data/tinystories_valid_head256k.txt";

// stories260K, loaded on first use and kept for the process.
inline const LlamaModel& SharedModel() {
  static const LlamaModel* model = [] {
    auto loaded = LlamaModel::Load(kModelPath);
    KVS_CHECK(loaded.ok());
    return loaded->release();
  }();
  return *model;
}

// The validation text, read on first use.
inline const std::string& SharedText() {
  static const std::string* text = [] {
    std::ifstream file(kTextPath, std::ios::binary);
    KVS_CHECK(file.good());
    std::ostringstream out;
    out << file.rdbuf();
    return new std::string(out.str());
  }();
  return *text;
}

// The validation text encoded with BOS first, on first use.
inline const std::vector<TokenId>& SharedTokens() {
  static const std::vector<TokenId>* tokens =
      new std::vector<TokenId>(SharedModel().tokenizer().Encode(SharedText(), /*add_bos=*/true));
  return *tokens;
}

}  // namespace kvstack::e2e
