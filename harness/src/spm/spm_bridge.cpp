#include "spm_bridge.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#define CHIAR_SPM_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

void set_error(char* err, size_t size, const std::string& message) {
  if (!err || size == 0) return;
  std::strncpy(err, message.c_str(), size - 1);
  err[size - 1] = '\0';
}

int copy_out(const std::string& text, char* out, int capacity) {
  const int n = static_cast<int>(text.size());
  if (out && capacity > 0) std::memcpy(out, text.data(), static_cast<size_t>(std::min(n, capacity)));
  return n;
}

}  // namespace

CHIAR_SPM_EXPORT int chiar_spm_train(const char* args, char* err, size_t err_size) {
  const auto status = sentencepiece::SentencePieceTrainer::Train(args);
  if (status.ok()) return 0;
  set_error(err, err_size, status.ToString());
  return 1;
}

CHIAR_SPM_EXPORT void* chiar_spm_load(const char* model_path, char* err, size_t err_size) {
  auto* p = new sentencepiece::SentencePieceProcessor();
  const auto status = p->Load(model_path);
  if (status.ok()) return p;
  set_error(err, err_size, status.ToString());
  delete p;
  return nullptr;
}

CHIAR_SPM_EXPORT void chiar_spm_free(void* processor) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(processor);
}

CHIAR_SPM_EXPORT int chiar_spm_size(void* processor) {
  return static_cast<sentencepiece::SentencePieceProcessor*>(processor)->GetPieceSize();
}

CHIAR_SPM_EXPORT int chiar_spm_encode(void* processor, const char* text, size_t length, int* ids, int capacity) {
  std::vector<int> out;
  static_cast<sentencepiece::SentencePieceProcessor*>(processor)->Encode(std::string(text, length), &out);
  const int n = static_cast<int>(out.size());
  if (ids && capacity > 0) std::copy_n(out.begin(), std::min(n, capacity), ids);
  return n;
}

CHIAR_SPM_EXPORT int chiar_spm_piece(void* processor, int id, char* out, int capacity) {
  return copy_out(static_cast<sentencepiece::SentencePieceProcessor*>(processor)->IdToPiece(id), out, capacity);
}

CHIAR_SPM_EXPORT int chiar_spm_decode(void* processor, const int* ids, int n, char* out, int capacity) {
  std::string text;
  static_cast<sentencepiece::SentencePieceProcessor*>(processor)->Decode(std::vector<int>(ids, ids + n), &text);
  return copy_out(text, out, capacity);
}
