// The non-template parts of trainer/flag_values.h: the check that every numeric flag is read by
// read_number, and the warnings for flags given twice.
#include "trainer/flag_values.h"

#include <algorithm>
#include <stdexcept>

namespace llm {

void NumberFlags::check_every_number_is_ours(const CLI::App& app) const {
  for (const CLI::Option* option : app.get_options()) {
    const std::string type = option->get_type_name();
    if ((type == "INT" || type == "UINT" || type == "FLOAT" || type == "NUMBER") && ours_.count(option) == 0)
      throw std::logic_error("command line: " + option->get_name() +
                             " is a number read by CLI11 (clamps, wraps, octal); add it with NumberFlags::add");
  }
  for (const CLI::App* subcommand : app.get_subcommands([](const CLI::App*) { return true; }))
    check_every_number_is_ours(*subcommand);
}

void collect_repeated_flags(const CLI::App& app, std::vector<std::string>& warnings) {
  for (const CLI::Option* option : app.get_options()) {
    if (option->get_items_expected_max() > 1) continue;  // a list: every value counts
    const std::vector<std::string>& given = option->results();
    if (given.size() < 2 || std::all_of(given.begin(), given.end(),
                                        [&](const std::string& value) { return value == given.front(); }))
      continue;
    std::string values;
    for (const std::string& value : given) values += (values.empty() ? "" : ", ") + value;
    warnings.push_back(std::string(kCommandLine) + ": " + option->get_name() + " given " +
                       std::to_string(given.size()) + " times (" + values + "); using the last, " +
                       given.back());
  }
  for (const CLI::App* subcommand : app.get_subcommands()) collect_repeated_flags(*subcommand, warnings);
}

}  // namespace llm
