// datastore_vectors_test.cpp - the native datastore's drafts for contexts the Python test sends, compared there with
// edge_spec.decoding.datastore's (tests/test_native_datastore.py).
//
//   datastore_vectors_test DATASTORE_BIN VOCAB_SIZE < contexts   one line per context: "k id id ...";
//   prints one line per context: the draft's ids, space-separated (an empty line: no draft). A bad file: its error
//   on stderr, exit 2.
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>

#include "datastore.h"
#include "errors.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: datastore_vectors_test DATASTORE_BIN VOCAB_SIZE < contexts\n");
    return 1;
  }
  try {
    auto store = es::Datastore::load(argv[1], std::stoll(argv[2]));
    std::string line;
    while (std::getline(std::cin, line)) {
      std::istringstream in(line);
      int k = 0;
      in >> k;
      std::vector<int64_t> context;
      for (int64_t id; in >> id;) context.push_back(id);
      std::string out;
      for (int64_t t : store->propose(context, k)) out += (out.empty() ? "" : " ") + std::to_string(t);
      std::cout << out << "\n";
    }
  } catch (const es::Error& err) {
    std::fprintf(stderr, "error: %s\n", err.what());
    return 2;
  }
  return 0;
}
