#include "optim/adamw.h"
