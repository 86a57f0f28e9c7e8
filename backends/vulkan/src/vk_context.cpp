// vk_context.cpp - instance, validation messenger, device selection, queue.
#include "vk_context.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace touchstone::vk {
namespace {

using abi::StatusError;

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

VKAPI_ATTR VkBool32 VKAPI_CALL messenger_cb(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                            VkDebugUtilsMessageTypeFlagsEXT,
                                            const VkDebugUtilsMessengerCallbackDataEXT* data,
                                            void* user) {
  if (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) {
    static_cast<Context*>(user)->on_validation_error(data && data->pMessage ? data->pMessage
                                                                            : "(no message)");
  }
  return VK_FALSE;
}

int type_rank(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
      return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
      return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
      return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
      return 3;
    default:
      return 4;
  }
}

const char* type_name(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
      return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
      return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
      return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
      return "cpu";
    default:
      return "other";
  }
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool has_compute_queue(VkPhysicalDevice d, uint32_t* family) {
  uint32_t n = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(d, &n, nullptr);
  std::vector<VkQueueFamilyProperties> props(n);
  vkGetPhysicalDeviceQueueFamilyProperties(d, &n, props.data());
  for (uint32_t i = 0; i < n; ++i) {
    if (props[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
      *family = i;
      return true;
    }
  }
  return false;
}

// Picks a physical device (see vk_context.h); throws TS_ERR_DEVICE with the reason.
VkPhysicalDevice select_device(VkInstance instance, uint32_t* family) {
  uint32_t n = 0;
  VkResult r = vkEnumeratePhysicalDevices(instance, &n, nullptr);
  if (r != VK_SUCCESS || n == 0)
    throw StatusError(TS_ERR_DEVICE, "no Vulkan physical device found");
  std::vector<VkPhysicalDevice> devs(n);
  check(vkEnumeratePhysicalDevices(instance, &n, devs.data()), "vkEnumeratePhysicalDevices");
  std::vector<VkPhysicalDeviceProperties> props(n);
  std::string listing;
  for (uint32_t i = 0; i < n; ++i) {
    vkGetPhysicalDeviceProperties(devs[i], &props[i]);
    listing += (i ? ", " : "") + std::to_string(i) + ": " + props[i].deviceName;
  }
  auto usable = [&](uint32_t i) {
    return props[i].apiVersion >= VK_API_VERSION_1_1 && has_compute_queue(devs[i], family);
  };
  if (const char* want = std::getenv("TOUCHSTONE_VULKAN_DEVICE"); want && *want) {
    const std::string w(want);
    const bool is_index = std::all_of(
        w.begin(), w.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    for (uint32_t i = 0; i < n; ++i) {
      const bool match = is_index ? std::to_string(i) == w
                                  : lower(props[i].deviceName).find(lower(w)) != std::string::npos;
      if (match) {
        if (!usable(i)) {
          throw StatusError(TS_ERR_DEVICE, "TOUCHSTONE_VULKAN_DEVICE=" + w + " selects '" +
                                               props[i].deviceName +
                                               "', which lacks Vulkan 1.1 or a compute queue");
        }
        return devs[i];
      }
    }
    throw StatusError(TS_ERR_DEVICE,
                      "TOUCHSTONE_VULKAN_DEVICE=" + w + " matches no device (" + listing + ")");
  }
  int best = -1;
  for (uint32_t i = 0; i < n; ++i) {
    if (!usable(i)) continue;
    if (best < 0 || type_rank(props[i].deviceType) < type_rank(props[uint32_t(best)].deviceType))
      best = int(i);
  }
  if (best < 0)
    throw StatusError(TS_ERR_DEVICE, "no Vulkan 1.1 device with a compute queue (" + listing + ")");
  has_compute_queue(devs[uint32_t(best)], family);
  return devs[uint32_t(best)];
}

bool instance_has_layer(const char* name) {
  uint32_t n = 0;
  vkEnumerateInstanceLayerProperties(&n, nullptr);
  std::vector<VkLayerProperties> layers(n);
  vkEnumerateInstanceLayerProperties(&n, layers.data());
  for (const auto& l : layers) {
    if (std::strcmp(l.layerName, name) == 0) return true;
  }
  return false;
}

bool instance_has_extension(const char* name) {
  uint32_t n = 0;
  vkEnumerateInstanceExtensionProperties(nullptr, &n, nullptr);
  std::vector<VkExtensionProperties> exts(n);
  vkEnumerateInstanceExtensionProperties(nullptr, &n, exts.data());
  for (const auto& e : exts) {
    if (std::strcmp(e.extensionName, name) == 0) return true;
  }
  return false;
}

}  // namespace

void check(VkResult r, const char* what) {
  if (r != VK_SUCCESS) {
    const ts_status s = (r == VK_ERROR_OUT_OF_HOST_MEMORY || r == VK_ERROR_OUT_OF_DEVICE_MEMORY)
                            ? TS_ERR_OUT_OF_MEMORY
                            : TS_ERR_DEVICE;
    throw StatusError(s, std::string(what) + " failed: VkResult " + std::to_string(int(r)));
  }
}

std::shared_ptr<Context> Context::create() {
  std::shared_ptr<Context> c(new Context());
  c->validation_ = env_flag("TOUCHSTONE_VULKAN_VALIDATION");
  c->create_instance();
  c->read_device();
  c->create_device();
  c->check_validation();
  return c;
}

void Context::create_instance() {
  constexpr const char* kLayer = "VK_LAYER_KHRONOS_validation";

  auto app = vk_struct<VkApplicationInfo>(VK_STRUCTURE_TYPE_APPLICATION_INFO);
  app.pApplicationName = "touchstone";
  app.apiVersion = VK_API_VERSION_1_1;
  std::vector<const char*> layers, exts;
  if (validation_) {
    if (!instance_has_layer(kLayer)) {
      throw StatusError(TS_ERR_INTERNAL,
                        "TOUCHSTONE_VULKAN_VALIDATION=1 but VK_LAYER_KHRONOS_validation is not "
                        "installed (Debian: vulkan-validationlayers)");
    }
    layers.push_back(kLayer);
  }
  // The messenger also catches errors when the layer is enabled from outside
  // (VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation).
  const bool debug_utils = instance_has_extension(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
  if (debug_utils) exts.push_back(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
  if (validation_ && !debug_utils) {
    throw StatusError(TS_ERR_INTERNAL,
                      "validation requested but VK_EXT_debug_utils is unavailable");
  }

  auto mci = vk_struct<VkDebugUtilsMessengerCreateInfoEXT>(
      VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT);
  mci.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT |
                        VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT;
  mci.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                    VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                    VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
  mci.pfnUserCallback = messenger_cb;
  mci.pUserData = this;

  auto ici = vk_struct<VkInstanceCreateInfo>(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
  ici.pApplicationInfo = &app;
  ici.enabledLayerCount = uint32_t(layers.size());
  ici.ppEnabledLayerNames = layers.data();
  ici.enabledExtensionCount = uint32_t(exts.size());
  ici.ppEnabledExtensionNames = exts.data();
  if (debug_utils) ici.pNext = &mci;  // also reports errors of vkCreateInstance itself
  const VkResult r = vkCreateInstance(&ici, nullptr, &instance_);
  if (r != VK_SUCCESS) {
    throw StatusError(TS_ERR_DEVICE, "no usable Vulkan driver (vkCreateInstance: VkResult " +
                                         std::to_string(int(r)) + ")");
  }
  if (debug_utils) {
    auto create_messenger = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkCreateDebugUtilsMessengerEXT"));
    if (create_messenger) {
      check(create_messenger(instance_, &mci, nullptr, &messenger_),
            "vkCreateDebugUtilsMessengerEXT");
    }
  }
}

void Context::read_device() {
  phys_ = select_device(instance_, &queue_family_);
  auto sg = vk_struct<VkPhysicalDeviceSubgroupProperties>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES);
  auto p2 = vk_struct<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2);
  p2.pNext = &sg;
  vkGetPhysicalDeviceProperties2(phys_, &p2);
  info_.name = p2.properties.deviceName;
  info_.type = type_name(p2.properties.deviceType);
  info_.subgroup_size = sg.subgroupSize;
  info_.subgroup_arithmetic = (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                              (sg.supportedOperations & VK_SUBGROUP_FEATURE_BASIC_BIT) &&
                              (sg.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT);
  info_.subgroup_shuffle = (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                           (sg.supportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_BIT);
  info_.max_storage_buffer_range = p2.properties.limits.maxStorageBufferRange;
  info_.min_storage_buffer_offset_alignment = p2.properties.limits.minStorageBufferOffsetAlignment;
  info_.max_group_count_x = p2.properties.limits.maxComputeWorkGroupCount[0];
  const char* sg_env = std::getenv("TOUCHSTONE_VULKAN_SUBGROUP");
  use_subgroup_ = info_.subgroup_arithmetic && !(sg_env && std::strcmp(sg_env, "0") == 0);
  VkPhysicalDeviceFeatures features{};
  vkGetPhysicalDeviceFeatures(phys_, &features);
  info_.int64 = features.shaderInt64 == VK_TRUE;
  // matmul_rows.comp runs one subgroup of 8 per workgroup, shuffles within it
  // and loads through 64-bit vectors.
  const bool rows_ok = info_.subgroup_shuffle && sg.subgroupSize == 8 && info_.int64;
  matmul_rows_ = rows_ok && p2.properties.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
  if (const char* mm = std::getenv("TOUCHSTONE_VULKAN_MATMUL"); mm && *mm) {
    if (std::strcmp(mm, "rows") == 0) {
      if (!rows_ok) {
        throw StatusError(
            TS_ERR_UNSUPPORTED,
            "TOUCHSTONE_VULKAN_MATMUL=rows needs subgroup size 8 with shuffle (device "
            "has " +
                std::to_string(sg.subgroupSize) + ")");
      }
      matmul_rows_ = true;
    } else if (std::strcmp(mm, "split") == 0) {
      matmul_rows_ = false;
    } else {
      throw StatusError(TS_ERR_INVALID_ARGUMENT,
                        std::string("TOUCHSTONE_VULKAN_MATMUL=") + mm + ": expected rows or split");
    }
  }
  vkGetPhysicalDeviceMemoryProperties(phys_, &mem_);
}

void Context::create_device() {
  const float prio = 1.0f;
  auto qci = vk_struct<VkDeviceQueueCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO);
  qci.queueFamilyIndex = queue_family_;
  qci.queueCount = 1;
  qci.pQueuePriorities = &prio;
  auto dci = vk_struct<VkDeviceCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO);
  dci.queueCreateInfoCount = 1;
  dci.pQueueCreateInfos = &qci;
  VkPhysicalDeviceFeatures enabled{};
  enabled.shaderInt64 = info_.int64 ? VK_TRUE : VK_FALSE;  // matmul_rows.comp
  dci.pEnabledFeatures = &enabled;
  check(vkCreateDevice(phys_, &dci, nullptr, &device_), "vkCreateDevice");
  vkGetDeviceQueue(device_, queue_family_, 0, &queue_);

  auto pci = vk_struct<VkCommandPoolCreateInfo>(VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO);
  pci.flags =
      VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT | VK_COMMAND_POOL_CREATE_TRANSIENT_BIT;
  pci.queueFamilyIndex = queue_family_;
  check(vkCreateCommandPool(device_, &pci, nullptr, &pool_), "vkCreateCommandPool");
  auto fci = vk_struct<VkFenceCreateInfo>(VK_STRUCTURE_TYPE_FENCE_CREATE_INFO);
  check(vkCreateFence(device_, &fci, nullptr, &fence_), "vkCreateFence");
}

Context::~Context() {
  if (device_) {
    vkDeviceWaitIdle(device_);
    if (fence_) vkDestroyFence(device_, fence_, nullptr);
    if (pool_) vkDestroyCommandPool(device_, pool_, nullptr);
    vkDestroyDevice(device_, nullptr);
  }
  if (messenger_) {
    auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkDestroyDebugUtilsMessengerEXT"));
    if (destroy) destroy(instance_, messenger_, nullptr);
  }
  if (instance_) vkDestroyInstance(instance_, nullptr);
}

uint32_t Context::memory_type(uint32_t bits, VkMemoryPropertyFlags want,
                              VkMemoryPropertyFlags prefer) const {
  int fallback = -1;
  for (uint32_t i = 0; i < mem_.memoryTypeCount; ++i) {
    if (!(bits & (1u << i))) continue;
    const VkMemoryPropertyFlags f = mem_.memoryTypes[i].propertyFlags;
    if ((f & want) != want) continue;
    if ((f & prefer) == prefer) return i;
    if (fallback < 0) fallback = int(i);
  }
  if (fallback < 0)
    throw StatusError(TS_ERR_DEVICE, "no Vulkan memory type with the required properties");
  return uint32_t(fallback);
}

VkCommandBuffer Context::begin() {
  VkCommandBuffer cb = VK_NULL_HANDLE;
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    auto ai =
        vk_struct<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
    ai.commandPool = pool_;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    check(vkAllocateCommandBuffers(device_, &ai, &cb), "vkAllocateCommandBuffers");
  }
  auto bi = vk_struct<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  check(vkBeginCommandBuffer(cb, &bi), "vkBeginCommandBuffer");
  return cb;
}

void Context::submit_and_wait(VkCommandBuffer cb) {
  std::lock_guard<std::mutex> lock(queue_mutex_);
  struct Free {
    Context* c;
    VkCommandBuffer cb;
    ~Free() { vkFreeCommandBuffers(c->device_, c->pool_, 1, &cb); }
  } free_cb{this, cb};
  check(vkEndCommandBuffer(cb), "vkEndCommandBuffer");
  auto si = vk_struct<VkSubmitInfo>(VK_STRUCTURE_TYPE_SUBMIT_INFO);
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cb;
  check(vkQueueSubmit(queue_, 1, &si, fence_), "vkQueueSubmit");
  const VkResult r = vkWaitForFences(device_, 1, &fence_, VK_TRUE, UINT64_MAX);
  vkResetFences(device_, 1, &fence_);
  check(r, "vkWaitForFences");
  check_validation();
}

void Context::on_validation_error(const char* message) {
  std::lock_guard<std::mutex> lock(error_mutex_);
  if (n_validation_errors_++ == 0) first_validation_error_ = message;
}

void Context::check_validation() const {
  const int n = n_validation_errors_.load();
  if (n == 0) return;
  std::lock_guard<std::mutex> lock(error_mutex_);
  throw StatusError(TS_ERR_INTERNAL, "Vulkan validation layer reported " + std::to_string(n) +
                                         " error(s); first: " + first_validation_error_);
}

std::string probe_device_description() {
  try {
    return Context::create()->description();
  } catch (const std::exception& e) {
    return std::string("Vulkan: no device (") + e.what() + ")";
  }
}

}  // namespace touchstone::vk
