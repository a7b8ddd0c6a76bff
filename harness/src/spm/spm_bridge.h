#pragma once
// C interface of libchiar_spm.so, the only library that links sentencepiece.
// Debian's libsentencepiece exports a bundled protobuf that clashes with the
// libprotobuf libtorch loads (a process linking both crashes before main), so
// the core opens this bridge with RTLD_LOCAL | RTLD_DEEPBIND: sentencepiece
// binds to its own protobuf and never enters the global symbol scope.
#include <cstddef>

extern "C" {
// 0 on success; otherwise a message in err.
int chiar_spm_train(const char* args, char* err, size_t err_size);
// A processor handle, or null with a message in err.
void* chiar_spm_load(const char* model_path, char* err, size_t err_size);
void chiar_spm_free(void* processor);
int chiar_spm_size(void* processor);
// Number of ids of text; writes min(count, capacity) of them to ids.
int chiar_spm_encode(void* processor, const char* text, size_t length, int* ids, int capacity);
// Length of the piece's text; writes min(length, capacity) bytes to out.
int chiar_spm_piece(void* processor, int id, char* out, int capacity);
// Length of the decoded text; writes min(length, capacity) bytes to out.
int chiar_spm_decode(void* processor, const int* ids, int n, char* out, int capacity);
}
