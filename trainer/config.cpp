#include "trainer/config.h"
