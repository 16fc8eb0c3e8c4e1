// Loading a corpus model (../shared/models/NAME) with its data set, and checking outputs against it.
#pragma once

#include <gtest/gtest.h>

#include "tessel/driver/compare.h"
#include "tessel/driver/model_dir.h"
#include "tessel/frontend/onnx/importer.h"
#include "test_util.h"

namespace tessel::testenv {

struct CorpusCase {
  ImportedModel model;
  std::vector<Tensor> inputs, refs;
};

// Imports the model with its test_data_set_0 input shapes bound.
inline CorpusCase load_corpus_model(const std::string& name) {
  ModelPaths mp = resolve_model(shared_dir() + "/models/" + name);
  CorpusCase c;
  c.inputs = read_data_set(mp.data_sets.at(0), "input");
  c.refs = read_data_set(mp.data_sets.at(0), "output");
  ImportOptions io;
  for (const auto& t : c.inputs) io.input_shapes.push_back(t.shape());
  c.model = import_onnx(mp.model, io);
  return c;
}

// The model criterion: max|out - ref| / max|ref| <= max_rel for every output.
inline void expect_matches_reference(const std::vector<Tensor>& outs, const std::vector<Tensor>& refs,
                                     const std::string& what, double max_rel = 1e-4) {
  ASSERT_EQ(outs.size(), refs.size()) << what;
  Tolerance tol;
  tol.max_rel = max_rel;
  for (size_t i = 0; i < outs.size(); ++i) {
    Comparison c = compare_tensors(outs[i], refs[i], tol);
    EXPECT_TRUE(c.match) << what << " output " << i << ": " << c.mismatch << " (max abs " << c.max_abs << ", rel "
                         << c.rel << ")";
  }
}

}  // namespace tessel::testenv
