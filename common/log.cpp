#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace llm::log {
namespace {

std::shared_ptr<spdlog::logger>& logger() {
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto created = spdlog::stderr_color_mt("trainer");
    created->set_pattern("[%H:%M:%S] %^%l%$ %v");
    return created;
  }();
  return instance;
}

}  // namespace

void configure(int rank, int world_size) {
  if (world_size > 1)
    logger()->set_pattern("[%H:%M:%S] [rank " + std::to_string(rank) + "] %^%l%$ %v");
}

void info(const std::string& message) { logger()->info(message); }
void warn(const std::string& message) { logger()->warn(message); }
void error(const std::string& message) { logger()->error(message); }

}  // namespace llm::log
