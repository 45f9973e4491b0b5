// Precompiled header: the LibTorch headers nearly every translation unit needs. Kept to the tensor
// library and the nn frontend's module base; never <torch/torch.h>, which drags in everything.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>
